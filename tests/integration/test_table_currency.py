"""A table committer never appends a segment that is no longer current, against a real
PostgreSQL (catalog and metastore) and a local store: a replacement committed between the pages
of a batch, or while a committer is frozen between choosing its batch and its Iceberg commit
(past gc's grace period, gc having deleted the replaced files), puts nothing in the table twice
and no file gc deleted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import SQLAlchemyError

from ingest.ops.gc import collect_garbage
from ingest.table import committer as committer_module
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_dev.testkit import wait_until
from metastore.tables import StaleTableCommit, TableCommit, TableKind, TableStore, fence_commit
from tests.integration.iceberg_harness import (
    Source,
    assert_exactly_once,
    audit_findings,
    committer,
    compact,
    table_files,
    table_offsets,
)


@pytest.fixture
def src(database_url: str, tmp_path: Path) -> Iterator[Source]:
    source = Source(database_url, f"file://{tmp_path}/store")
    yield source
    source.store.close()


@pytest.mark.parametrize("kind", [TableKind.DATA, TableKind.REJECTS])
def test_a_replacement_between_the_pages_of_a_batch_is_not_appended_beside_what_it_replaced(
    database_url: str, src: Source, kind: TableKind
) -> None:
    """The first page (``batch_segments`` 3) is full but holds two segments with files and one
    without; compaction replaces the two before the second page is read. The data table must
    not hold their rows twice, the rejects table must not be given their (carried) rejects
    files twice, and the committer goes on."""
    a, b = src.publish(2, rejects=1), src.publish(2, rejects=1)
    src.publish(0, holes=2)  # no file of either kind: fills the first page, joins no batch
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
    with committer(database_url, src.name, batch=3) as c:
        real = c.store.pending
        pages: list[int] = []

        def pending(*args: Any, **kwargs: Any) -> Any:
            if len(pages) == 1:
                compact(src, [a, b])
            page = real(*args, **kwargs)
            pages.append(len(page))
            return page

        c.store.pending = pending  # type: ignore[method-assign]
        c.commit_pending(kind)
        assert pages[0] == 3 and len(pages) > 1  # the replacement came between two pages
        c.store.pending = real  # type: ignore[method-assign]
        c.commit_all()
    rows = Counter(table_offsets(database_url, src.name, kind))
    assert [o for o, n in rows.items() if n > 1] == []
    assert sorted(rows) == ([0, 1, 3, 4] if kind is TableKind.DATA else [2, 5])
    assert audit_findings(database_url, src.name) == []


def test_a_committer_frozen_past_gcs_grace_before_its_commit_appends_no_file_gc_deleted(
    database_url: str, src: Source
) -> None:
    """The committer chose segments a and b and staged their files; frozen right before its
    catalog swap, it wakes after compaction replaced them and gc, one grace period later
    (grace 0 here), deleted their files. Its commit must not land: every file the table lists
    exists after it, and the replacement's rows are there once."""
    src.publish(2)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()  # the table exists: the next catalog swap is an append
        a, b = src.publish(3), src.publish(3)
        replaced = {f for s in src.store.segments(src.name) if s["id"] in (a, b) for f in s["files"]}
        real = c.catalog.commit_table
        woke: list[int] = []

        def frozen_then_commit(*args: Any, **kwargs: Any) -> Any:
            if not woke:
                woke.append(compact(src, [a, b]))
                assert set(collect_garbage(src.store, src.name, grace_s=0).deleted) == replaced
            return real(*args, **kwargs)

        c.catalog.commit_table = frozen_then_commit  # type: ignore[method-assign]
        result = c.commit_batch(TableKind.DATA)
        assert woke and result is not None
        missing = sorted(f for f in table_files(c) if not Path(f.removeprefix("file://")).exists())
        assert missing == []
        assert result.segment_ids == (woke[0],)
        assert c.commit_all() == []
    assert_exactly_once(database_url, src)
    assert audit_findings(database_url, src.name) == []


def test_the_fence_records_only_a_commit_that_matches_the_metastore(database_url: str, src: Source) -> None:
    """The check in the catalog's swap, on its own (each call in a transaction rolled back):
    it refuses a replaced segment, a held one, a replacement appended beside the segments it
    replaced, and a commit number the metastore is not one short of."""
    held = src.publish(2)
    a, b = src.publish(3), src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
    new = compact(src, [a, b])

    def fence(seq: int, ids: tuple[int, ...], removed: tuple[int, ...] = ()) -> str:
        commit = TableCommit(src.name, TableKind.DATA, seq, ids, None, datetime.now(UTC), removed)
        with psycopg.connect(database_url) as conn:
            try:
                fence_commit(conn, commit)
                return "recorded"
            except StaleTableCommit as exc:
                return str(exc).split(": ", 1)[1]
            finally:
                conn.rollback()

    assert fence(2, (a,)) == f"segments [{a}] are no longer current, or held already"
    assert fence(2, (held,)) == f"segments [{held}] are no longer current, or held already"
    assert fence(2, (new,)) == f"its segments replaced held segments [{a}, {b}], not []"
    assert fence(3, (new,), (a, b)) == "the metastore recorded commit 1"
    assert fence(2, (new,), (a, b)) == "recorded"
    with TableStore(database_url) as store:
        assert store.table(src.name, TableKind.DATA).committed_seq == 1


def test_a_committer_frozen_inside_its_catalog_swap_blocks_nothing_past_the_idle_timeout(
    database_url: str, src: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen after its fence ran, before its COMMIT, it holds the table's catalog row and its
    segments' rows: the server ends its session once it idled one statement timeout (1 s here)
    in the transaction. Nothing of the swap commits, and compaction and the next commit go on."""
    monkeypatch.setenv("INGEST_DB_STATEMENT_TIMEOUT_S", "1")
    src.publish(2)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        a, b = src.publish(3), src.publish(3)
        real = committer_module.fence_commit

        def fence_then_freeze(conn: Any, commit: TableCommit, url: str) -> None:
            real(conn, commit, url)
            pid = conn.info.backend_pid
            with psycopg.connect(database_url, autocommit=True) as probe:
                alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
                wait_until(lambda: probe.execute(alive, (pid,)).fetchone() == (0,), 15, "the session's end")

        monkeypatch.setattr(committer_module, "fence_commit", fence_then_freeze)
        with pytest.raises(SQLAlchemyError):
            c.commit_batch(TableKind.DATA)
        monkeypatch.setattr(committer_module, "fence_commit", real)
        assert c.store.table(src.name, TableKind.DATA).committed_seq == 1
        new = compact(src, [a, b])
        result = c.commit_batch(TableKind.DATA)
        assert result is not None and (result.seq, result.segment_ids) == (2, (new,))
    assert_exactly_once(database_url, src)
