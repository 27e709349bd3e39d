"""A table committer never appends a segment that is no longer current, against a real
PostgreSQL (the metastore, and the metastore's catalog) and a local store, or a REST catalog
(Nessie) and an S3 store: a replacement committed between the pages of a batch, or while a
committer is frozen between choosing its batch and its Iceberg commit (past gc's grace period,
gc having deleted the replaced files), puts nothing in the table twice and no file gc deleted.
In the metastore's catalog the fence in the catalog's swap refuses such a commit; in another
catalog the intent recorded before the swap does, or, recorded before the replacement, keeps
gc off the batch's files until the commit it names is settled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from pyarrow.fs import FileType
from sqlalchemy.exc import SQLAlchemyError

from ingest.ops.gc import collect_garbage
from ingest.segments.store import filesystem
from ingest.table import committer as committer_module
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_dev.testkit import wait_until
from metastore.tables import StaleTableCommit, TableCommit, TableKind, TableStore, fence_commit
from tests.fixtures.catalogs import CATALOGS, TableCatalog
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
def src(database_url: str, table_catalog: TableCatalog) -> Iterator[Source]:
    source = Source(database_url, table_catalog.store, catalog=table_catalog.catalog)
    yield source
    source.store.close()


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type != FileType.NotFound)


@pytest.mark.parametrize(
    ("table_catalog", "kind"),
    [("sql", TableKind.DATA), ("sql", TableKind.REJECTS), ("rest", TableKind.DATA)],
    indirect=["table_catalog"],
)
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


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_committer_frozen_past_gcs_grace_before_its_commit_appends_no_file_gc_deleted(
    database_url: str, src: Source, table_catalog: TableCatalog
) -> None:
    """The committer chose segments a and b and staged their files; frozen right before what
    guards its commit (the metastore's catalog: its swap, whose transaction runs the fence;
    another catalog: the intent recorded before its swap), it wakes after compaction replaced
    them and gc, one grace period later (grace 0 here), deleted their files. Its commit must not
    land: every file the table lists exists after it, and the replacement's rows are there once."""
    src.publish(2)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()  # the table exists: the next catalog swap is an append
        a, b = src.publish(3), src.publish(3)
        replaced = {f for s in src.store.segments(src.name) if s["id"] in (a, b) for f in s["files"]}
        guard: Any = c.store if table_catalog.external else c.catalog
        name = "record_intent" if table_catalog.external else "commit_table"
        real = getattr(guard, name)
        woke: list[int] = []

        def frozen_then_commit(*args: Any, **kwargs: Any) -> Any:
            if not woke:
                woke.append(compact(src, [a, b]))
                assert set(collect_garbage(src.store, src.name, grace_s=0).deleted) == replaced
            return real(*args, **kwargs)

        setattr(guard, name, frozen_then_commit)
        result = c.commit_batch(TableKind.DATA)
        assert woke and result is not None
        missing = sorted(f for f in table_files(c) if not exists(f))
        assert missing == []
        assert result.segment_ids == (woke[0],)
        assert c.commit_all() == []
    assert_exactly_once(database_url, src)
    assert audit_findings(database_url, src.name) == []


@pytest.mark.parametrize("table_catalog", ["rest"], indirect=True)
def test_a_committer_frozen_after_its_intent_keeps_gc_off_its_files_and_its_commit_is_followed(
    database_url: str, src: Source
) -> None:
    """Another catalog: the committer recorded its intent (commit 2: segments a and b), then
    froze before its catalog swap; compaction replaced a and b and gc ran past its grace
    period. gc deletes nothing of a and b while the intent is live, the commit lands when the
    committer wakes (the table holds a and b, which are replaced), and the next commit follows
    the replacement (one overwrite snapshot: their files out, the replacement's in): every
    record once, every file the table lists there, and gc deletes a and b's files after."""
    src.publish(2)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        a, b = src.publish(3), src.publish(3)
        replaced = {f for s in src.store.segments(src.name) if s["id"] in (a, b) for f in s["files"]}
        real = c.catalog.commit_table
        woke: list[int] = []

        def frozen_then_commit(*args: Any, **kwargs: Any) -> Any:
            if not woke:
                woke.append(compact(src, [a, b]))
                assert collect_garbage(src.store, src.name, grace_s=0).deleted == []
            return real(*args, **kwargs)

        c.catalog.commit_table = frozen_then_commit  # type: ignore[method-assign]
        result = c.commit_batch(TableKind.DATA)
        assert woke and result is not None and result.segment_ids == (a, b)
        assert all(exists(f) for f in table_files(c))
        [followed] = c.commit_all()
        assert list(followed.segment_ids) == woke
        assert replaced.isdisjoint(table_files(c)) and all(exists(f) for f in table_files(c))
        assert set(collect_garbage(src.store, src.name, grace_s=0).deleted) == replaced
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

    def intent(seq: int, ids: tuple[int, ...], removed: tuple[int, ...] = ()) -> str:
        commit = TableCommit(src.name, TableKind.DATA, seq, ids, None, datetime.now(UTC), removed)
        with TableStore(database_url) as store:
            try:
                store.record_intent(commit)
                return "recorded"
            except StaleTableCommit as exc:
                return str(exc).split(": ", 1)[1]

    for check in (fence, intent):
        assert check(2, (a,)) == f"segments [{a}] are no longer current, or held already"
        assert check(2, (held,)) == f"segments [{held}] are no longer current, or held already"
        assert check(2, (new,)) == f"its segments replaced held segments [{a}, {b}], not []"
        assert check(3, (new,), (a, b)) == "the metastore recorded commit 1"
    assert fence(2, (new,), (a, b)) == "recorded"  # rolled back
    with TableStore(database_url) as store:
        assert store.table(src.name, TableKind.DATA).committed_seq == 1
    # Checked and recorded: commit 2's intent (the replacement) is live until commit 2 is recorded.
    assert intent(2, (new,), (a, b)) == "recorded"
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT seq, segment_ids FROM ingest_table_intents").fetchall() == [(2, [new])]


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
