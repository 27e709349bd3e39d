"""The Iceberg table follows segment replacements (compaction, migrations/0019), against a real
PostgreSQL and a local store: each replacement becomes one overwrite snapshot of the same rows,
applied once, a commit the metastore did not record included; gc keeps the replaced
files while the table holds them; the audit finds nothing while the committer is behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException

from ingest.ops.gc import collect_garbage
from ingest.table import committer as committer_module
from ingest.table.catalog import MetastoreCatalog
from ingest.table.committer import COMMIT_SEQ, TableCommitter
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from metastore.tables import TableKind
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


def assert_snapshots(c: TableCommitter, expected: list[str], kind: TableKind = TableKind.DATA) -> None:
    """The table's snapshots, oldest first: all of them in the metastore's catalog; Nessie's
    tables list their current snapshot only (their history is Nessie's own commits)."""
    assert snapshots(c, kind) == (expected if isinstance(c.catalog, MetastoreCatalog) else expected[-1:])


def snapshots(c: TableCommitter, kind: TableKind = TableKind.DATA) -> list[str]:
    table = c.load(kind)
    assert table is not None
    return [s.summary.operation.value if s.summary else "" for s in table.snapshots()]


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_replacement_becomes_one_overwrite_snapshot_and_every_record_stays_once(
    database_url: str, src: Source
) -> None:
    ids = [src.publish(10), src.publish(5, rejects=2), src.publish(7), src.publish(3)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        assert_exactly_once(database_url, src)
        new = compact(src, ids[:3])
        # Replaced, not followed yet: the table still holds the old files, and that is no finding.
        assert audit_findings(database_url, src.name) == []
        results = c.commit_all()
        # One commit of each table (the rejects table: the same files, a snapshot that changes none).
        assert [(r.kind, r.segment_ids) for r in results] == [(TableKind.DATA, (new,)), (TableKind.REJECTS, (new,))]
        assert_snapshots(c, ["append", "overwrite"])
        assert_snapshots(c, ["append", "overwrite"], TableKind.REJECTS)
        assert_exactly_once(database_url, src)
        listed = {s["id"]: s for s in src.store.segments(src.name)}
        assert table_files(c) == {*listed[new]["files"], *listed[ids[3]]["files"]}
        assert table_offsets(database_url, src.name, TableKind.REJECTS) == [15, 16]
        assert table_files(c, TableKind.REJECTS) == set(listed[new]["rejects_files"])
        assert c.commit_all() == []
        assert audit_findings(database_url, src.name) == []

        # Replaced again before the committer looked: the segment it held (new) and one it
        # never held (later) are replaced through an intermediate replacement it never held.
        later = src.publish(6)
        middle = compact(src, [new, ids[3]])
        last = compact(src, [middle, later])
        assert audit_findings(database_url, src.name) == []
        results = c.commit_all()
        assert [(r.kind, r.segment_ids) for r in results] == [(TableKind.DATA, (last,)), (TableKind.REJECTS, (last,))]
        assert_snapshots(c, ["append", "overwrite", "overwrite"])
        assert table_files(c) == set(src.store.segments(src.name)[0]["files"])
        assert_exactly_once(database_url, src)
        assert audit_findings(database_url, src.name) == []


def test_a_replacement_commit_the_metastore_did_not_record_replaces_once(
    database_url: str, src: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table one commit (a replacement) ahead of the metastore: a committer that recorded
    each commit after its catalog swap, not in it, died between the two."""
    ids = [src.publish(10), src.publish(10), src.publish(4)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
    new = compact(src, ids[:2])
    with committer(database_url, src.name) as c:
        monkeypatch.setattr(committer_module, "fence_commit", lambda conn, commit, url: None)
        assert c.commit_batch(TableKind.DATA) is not None
        monkeypatch.undo()
    with committer(database_url, src.name) as c:
        table = c.load(TableKind.DATA)
        assert table is not None and table.properties[COMMIT_SEQ] == "2"
        assert c.store.table(src.name, TableKind.DATA).committed_seq == 1
        # The audit reads the table as the metastore recorded it: the unrecorded commit is no finding.
        assert audit_findings(database_url, src.name) == []
        later = src.publish(3)
        # Reconciled (the replacement recorded from the table's properties), then only the new one.
        assert [r.segment_ids for r in c.commit_all()] == [(later,)]
        assert snapshots(c) == ["append", "overwrite", "append"]
        held = {int(r["segment_id"]) for r in c.store.held(src.name)}
        assert held == {new, ids[2], later}
    assert_exactly_once(database_url, src)
    assert audit_findings(database_url, src.name) == []


def test_gc_keeps_replaced_files_while_the_table_holds_them(database_url: str, src: Source) -> None:
    ids = [src.publish(5), src.publish(5)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        old_files = table_files(c)
        compact(src, ids)
        # Replaced, but the table still lists them: no grace makes gc delete them.
        assert collect_garbage(src.store, src.name, grace_s=0).deleted == []
        assert all(Path(f.removeprefix("file://")).exists() for f in old_files)
        c.commit_all()
        # Taken out of the table just now: readers of its previous snapshot get the grace period.
        assert collect_garbage(src.store, src.name, grace_s=3600).deleted == []
        done = collect_garbage(src.store, src.name, grace_s=0)
        assert sorted(done.deleted) == sorted(old_files)
        assert not table_files(c) & old_files
    assert_exactly_once(database_url, src)


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_zombie_committer_with_a_stale_choice_cannot_replace_again(database_url: str, src: Source) -> None:
    ids = [src.publish(5), src.publish(5)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
    compact(src, ids)
    with committer(database_url, src.name) as zombie, committer(database_url, src.name) as live:
        stale = zombie.load(TableKind.DATA)
        [chosen] = zombie.store.pending(src.name, TableKind.DATA, 100)
        assert chosen.supersedes == tuple(ids)
        assert [r.seq for r in live.commit_all()] == [2]
        # Chosen for commit 2 from the table as it was: refused as a conflict (then re-reconciled),
        # whether it holds the old table or loads the new one.
        for table in (stale, zombie.load(TableKind.DATA)):
            assert table is not None
            with pytest.raises(CommitFailedException):
                zombie._replace(table, TableKind.DATA, 2, chosen)
        assert zombie.commit_batch(TableKind.DATA) is None
        assert_snapshots(live, ["append", "overwrite"])
    assert_exactly_once(database_url, src)


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_zombie_frozen_in_its_swap_never_sets_the_table_back(database_url: str, src: Source) -> None:
    """A replacement that changes no file of the rejects table (it carries their rejects files)
    is chosen as commit 2; its committer freezes in the catalog's swap (another catalog: after
    its intent), while a live committer commits 2 (the same replacement) and 3. Woken, its
    commit must be refused: a catalog applies a change of properties alone to whatever the table
    holds by then, which would set its ingest.commit-seq back to 2 (the table then diverged from
    the metastore for good); every commit is a snapshot, checked against the head it was built on."""
    ids = [src.publish(2, rejects=1), src.publish(2, rejects=1)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
    with committer(database_url, src.name) as zombie, committer(database_url, src.name) as live:
        zombie.commit_all()
        compact(src, ids)
        real = zombie.catalog.commit_table
        woke: list[int] = []

        def frozen_then_commit(*args: Any, **kwargs: Any) -> Any:
            if not woke:
                woke.append(len(live.commit_pending(TableKind.REJECTS)))
                src.publish(1, rejects=1)
                woke.append(len(live.commit_pending(TableKind.REJECTS)))
            return real(*args, **kwargs)

        zombie.catalog.commit_table = frozen_then_commit  # type: ignore[method-assign]
        assert zombie.commit_batch(TableKind.REJECTS) is None  # refused, then nothing left to do
        assert woke == [1, 1]
        table = zombie.load(TableKind.REJECTS)
        assert table is not None and table.properties[COMMIT_SEQ] == "3"
        assert_snapshots(live, ["append", "overwrite", "append"], TableKind.REJECTS)
        assert [r.kind for r in live.commit_all()] == [TableKind.DATA, TableKind.DATA]  # the data table's two
        assert live.commit_all() == []
    assert_exactly_once(database_url, src)
    assert audit_findings(database_url, src.name) == []
