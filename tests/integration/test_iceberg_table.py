"""The Iceberg table committer against a real PostgreSQL (the catalog and the metastore) and a
local store: the table holds every published segment's rows exactly once, through a commit
the metastore did not record, zombie committers and snapshot expiry; spec changes
evolve the schema; gc and table maintenance agree on what is garbage. The committer as a process
and a role: test_iceberg_committer_role.py; Spark reading the tables: test_iceberg_spark_read.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from ingest.segments.store import build_dirs
from ingest.table.committer import COMMIT_SEQ, TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.errors import FileSpansPartitions, SchemaChangeRefused
from ingest.table.status import run_query, table_status
from ingest_common.errors import ConfigError
from ingest_common.model import BuildRegistration
from metastore.tables import TableKind, TableStore
from tests.fixtures.catalogs import CATALOGS, TableCatalog
from tests.fixtures.servers import S3Server
from tests.integration.iceberg_harness import Source, assert_exactly_once, commit_unrecorded, committer, table_offsets


@pytest.fixture
def src(database_url: str, table_catalog: TableCatalog) -> Iterator[Source]:
    source = Source(database_url, table_catalog.store, catalog=table_catalog.catalog)
    yield source
    source.store.close()


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_every_published_segment_is_appended_once_in_batches(
    database_url: str, src: Source, table_catalog: TableCatalog
) -> None:
    ids = [src.publish(10), src.publish(5, rejects=2), src.publish(0, holes=3), src.publish(7), src.publish(3)]
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
    with committer(database_url, src.name, batch=2) as c:
        results = c.commit_all()
        # The empty segment (offsets without records) needs no commit; the others go two at a time.
        data = [r for r in results if r.kind is TableKind.DATA]
        assert [r.seq for r in data] == [1, 2] and [len(r.segment_ids) for r in data] == [2, 2]
        assert [r.segment_ids for r in results if r.kind is TableKind.REJECTS] == [(ids[1],)]
        assert_exactly_once(database_url, src)
        assert table_offsets(database_url, src.name, TableKind.REJECTS) == [15, 16]
        assert c.commit_all() == []  # nothing pending: nothing appended again
        more = src.publish(4)
        assert [r.segment_ids for r in c.commit_all()] == [(more,)]
    assert_exactly_once(database_url, src)
    status = table_status(database_url, src.name)
    data_status = next(t for t in status["tables"] if t["table"] == "data")
    assert data_status["last_committed_segment"] == more and data_status["segments_behind"] == 0
    assert data_status["commits"] == data_status["table_commit_seq"] == 3
    # The metastore's catalog puts the table beside the segments, another one in its warehouse.
    assert data_status["location"].endswith(f"/{src.name}/_iceberg/data") is not table_catalog.external
    columns, rows = run_query(database_url, src.name, "SELECT count(*) AS n, count(DISTINCT _offset) FROM clicks")
    assert columns[0] == "n"
    assert rows == [(29, 29)]  # 10 + 5 + 7 + 3 + 4


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_commit_the_metastore_did_not_record_is_reconciled(database_url: str, src: Source) -> None:
    """A table one commit ahead of the metastore: what a committer that records each commit
    after its catalog swap (any catalog but the metastore's, or one of an earlier version) left
    when it died between the two."""
    src.publish(10)
    src.publish(10)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        commit_unrecorded(c)
    # The table holds commit 1; the metastore recorded nothing.
    with TableStore(database_url) as store:
        assert store.table(src.name, TableKind.DATA).committed_seq == 0
    src.publish(5)
    with committer(database_url, src.name) as c:
        results = c.commit_all()
    # Reconciled first (segments 1, 2 recorded from the table's properties), then only the new one.
    assert [(r.seq, len(r.segment_ids)) for r in results] == [(2, 1)]
    assert_exactly_once(database_url, src)


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_zombie_committer_with_a_stale_table_cannot_append(database_url: str, src: Source) -> None:
    src.publish(10)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as first:
        first.commit_all()
    src.publish(6)
    with committer(database_url, src.name) as zombie, committer(database_url, src.name) as live:
        stale = zombie.load(TableKind.DATA)
        assert stale is not None
        batch = zombie.store.pending(src.name, TableKind.DATA, 100)
        assert live.commit_all()  # the live committer appends the new segment
        # The zombie's commit was chosen from the table as it was: the catalog refuses it.
        with pytest.raises(CommitFailedException):
            zombie._append(stale, TableKind.DATA, 2, batch)
        # Once it looks again it finds nothing to do.
        assert zombie.commit_batch(TableKind.DATA) is None
    assert_exactly_once(database_url, src)


def test_expiring_snapshots_never_makes_it_append_again(database_url: str, src: Source) -> None:
    for _ in range(3):
        src.publish(4)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name, batch=1) as c:
        assert len(c.commit_all()) == 3
        table = c.load(TableKind.DATA)
        assert table is not None and len(table.snapshots()) == 3
        current = table.current_snapshot()
        assert current is not None
        expired = table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1))
        expired.commit()
        table = c.load(TableKind.DATA)
        assert table is not None and [s.snapshot_id for s in table.snapshots()] == [current.snapshot_id]
        assert table.properties[COMMIT_SEQ] == "3"
        src.publish(2)
        assert [len(r.segment_ids) for r in c.commit_all()] == [1]
    assert_exactly_once(database_url, src)


def test_a_spec_that_adds_a_column_evolves_the_table_and_a_refused_change_is_one_line(
    database_url: str, src: Source
) -> None:
    src.publish(5)
    src.columns["country"] = "string"
    src.apply()
    src.publish(5)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        table = c.load(TableKind.DATA)
        assert table is not None and "country" in table.schema().column_names
        rows = table.scan(selected_fields=("_offset", "country")).to_arrow().sort_by("_offset").to_pylist()
        assert [r["country"] for r in rows] == [None] * 5 + [f"country-{o}" for o in range(5, 10)]
        src.columns["id"] = "string"
        src.apply()
        src.publish(3)
        with pytest.raises(SchemaChangeRefused) as refused:
            c.commit_all()
        assert "spec version 3" in str(refused.value) and "\n" not in str(refused.value)
    # Nothing of the refused segment was appended.
    assert len(table_offsets(database_url, src.name)) == 10


def test_a_partitioned_table_takes_files_of_one_day_and_refuses_a_file_spanning_two(
    database_url: str, src: Source
) -> None:
    src.publish(10)
    with pytest.raises(ConfigError) as not_cut:
        enable_table(database_url, src.name, PartitionBy.DAY, RejectsMode.NONE)
    assert "file_partition" in str(not_cut.value) and "\n" not in str(not_cut.value)
    src.file_partition = "hour"
    src.apply()
    enable_table(database_url, src.name, PartitionBy.DAY, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        table = c.load(TableKind.DATA)
        assert table is not None and [f.name for f in table.spec().fields] == ["ts_day"]
        src.publish(3, day_span=True)  # a file as one built before the spec cut files by hour
        with pytest.raises(FileSpansPartitions) as refused:
            c.commit_all()
        assert "built before the spec's file_partition" in str(refused.value) and "\n" not in str(refused.value)
    # The spanning segment stays pending: neither appended in part nor skipped.
    assert len(table_offsets(database_url, src.name)) == 10
    with TableStore(database_url) as store:
        assert store.behind(src.name, TableKind.DATA)[0] == 1


def test_a_table_whose_rebase_setting_was_changed_still_refuses_a_stale_append(database_url: str, src: Source) -> None:
    src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as first:
        first.commit_all()
        table = first.load(TableKind.DATA)
        assert table is not None
        # pyiceberg's default: rebase a conflicting append up to 4 times.
        table.transaction().set_properties({"commit.retry.num-retries": "4"}).commit_transaction()
    src.publish(2)
    with committer(database_url, src.name) as zombie, committer(database_url, src.name) as live:
        stale = zombie.load(TableKind.DATA)
        assert stale is not None
        batch = zombie.store.pending(src.name, TableKind.DATA, 100)
        assert live.commit_all()
        with pytest.raises(CommitFailedException):
            zombie._append(stale, TableKind.DATA, 2, batch)
        table = live.load(TableKind.DATA)
        assert table is not None and table.properties["commit.retry.num-retries"] == "0"
    assert_exactly_once(database_url, src)


def test_gc_and_table_maintenance_agree_on_what_is_garbage(database_url: str, src: Source) -> None:
    from ingest.ops.gc import collect_garbage

    for _ in range(3):
        src.publish(4, rejects=1)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
    with committer(database_url, src.name, batch=1) as c:
        c.commit_all()
        # A registered build whose split was never published: garbage to gc, never in a table.
        build, split = uuid.uuid4(), uuid.uuid4()
        dirs = build_dirs(src.root, src.name, build)
        src.store.register_build(
            "w", BuildRegistration(build, src.name, dirs.staging, dirs.data, dirs.rejects, (split,))
        )
        stray = Source._write(f"{dirs.data}/part-stray.parquet", pa.table({"_offset": [99]}))
        tables = [c.load(kind) for kind in TableKind]
        # Expiring every snapshot but the current deletes no file (gc.enabled=false; pyiceberg
        # expires metadata only).
        for table in tables:
            assert table is not None and table.properties["gc.enabled"] == "false"
            table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1)).commit()
        held = {
            task.file.file_path
            for table in (c.load(kind) for kind in TableKind)
            if table
            for task in table.scan().plan_files()
        }
    result = collect_garbage(src.store, src.name, grace_s=0)
    assert result.unsafe == []
    published = {f for s in src.store.segments(src.name) for f in (*s["files"], *s["rejects_files"])}
    # The tables hold exactly the published files, and every one of them survived gc.
    assert held == published
    assert all(Path(f.removeprefix("file://")).exists() for f in held)
    assert not Path(stray.removeprefix("file://")).exists()
    assert_exactly_once(database_url, src)


def test_the_committer_keeps_a_bounded_number_of_snapshots(database_url: str, src: Source) -> None:
    for _ in range(5):
        src.publish(2)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    settings = CommitSettings(batch_segments=1, interval_s=0, keep_snapshots=2)
    with TableCommitter(database_url, src.name, settings) as c:
        assert len(c.commit_all()) == 5
        table = c.load(TableKind.DATA)
        assert table is not None and len(table.snapshots()) == 2 and table.properties[COMMIT_SEQ] == "5"
    assert_exactly_once(database_url, src)


def test_a_table_over_an_s3_store(database_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments and table metadata on an S3 API (``s3a://`` store URIs, the AWS variables the
    workers use): appended once, read back through pyiceberg."""
    for variable, value in s3_server.env.items():
        monkeypatch.setenv(variable, value)
    src = Source(database_url, s3_server.uri(f"table-{uuid.uuid4().hex[:8]}"))
    try:
        src.publish(6, rejects=1)
        src.publish(4)
        enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
        with committer(database_url, src.name) as c:
            assert len(c.commit_all()) == 2
            table = c.load(TableKind.DATA)
            assert table is not None and table.location().startswith("s3a://")
        assert_exactly_once(database_url, src)
    finally:
        src.store.close()


def test_a_query_before_the_first_commit_says_so_in_one_line(database_url: str, src: Source) -> None:
    from ingest.table.errors import TableError
    from metastore.tables import TableNotEnabled

    with pytest.raises(TableNotEnabled):
        run_query(database_url, src.name, "SELECT 1")
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with pytest.raises(TableError, match="created by the first commit"):
        run_query(database_url, src.name, "SELECT count(*) FROM clicks")
