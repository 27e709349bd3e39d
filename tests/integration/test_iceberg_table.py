"""The Iceberg table committer against a real PostgreSQL (the catalog and the metastore) and a
local store: the table holds every published segment's rows exactly once, through crashes
between the Iceberg commit and its record, zombie committers, snapshot expiry, a PostgreSQL
restart and a SIGKILLed committer process; spec changes evolve the schema; Spark (the product's
own, in the tests' session) reads exactly the committed rows through Iceberg's JdbcCatalog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import CommitFailedException

from ingest.build.segment_store import build_dirs, ensure_parent, filesystem
from ingest.spec import spec_from_dict
from ingest.table.catalog import MetastoreCatalog, identifier
from ingest.table.committer import COMMIT_SEQ, TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.errors import FileSpansPartitions, SchemaChangeRefused
from ingest.table.status import run_query, table_status
from ingest_common.errors import ConfigError
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.iceberg_spark import read_tables, spark_table
from ingest_dev.postgres import LocalPostgres
from metastore import Metastore, apply_migrations
from metastore.tables import TableKind, TableStore
from tests.fixtures.servers import S3Server

REPO = Path(__file__).resolve().parents[2]
T0 = TopicPartition("events", 0)
DAY0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
COLUMNS = {"id": "long", "user": "string", "ts": "timestamp"}


def spark_like(columns: dict[str, str]) -> pa.Schema:
    """The schema Spark writes: the meta columns, then the spec's; no Iceberg field ids."""
    types = {"long": pa.int64(), "string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema(
        [
            ("_topic", pa.string()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
            ("_timestamp", pa.timestamp("us", tz="UTC")),
            ("_key", pa.binary()),
            *((name, types[t]) for name, t in columns.items()),
        ]
    )


class Source:
    """A source whose segments are published as a worker publishes them (registered build,
    Parquet files written, one publish transaction), without Kafka or Spark."""

    def __init__(self, database_url: str, root: str, name: str = "clicks", partitions: int = 1) -> None:
        self.name = name
        self.root = root
        self.store = Metastore(database_url)
        self.columns = dict(COLUMNS)
        self.file_partition = "none"
        self.apply()
        self.store.register_partitions(name, T0.topic, list(range(partitions)), "earliest")
        tps = [TopicPartition(T0.topic, p) for p in range(partitions)]
        claims = self.store.claim_from(name, "w", tps, start=0)
        self.serials = {tp: claims[tp].serial for tp in tps}
        self.next = dict.fromkeys(tps, 0)
        self.version = 1

    def apply(self) -> None:
        doc = {
            "name": self.name,
            "topics": [T0.topic],
            "schema": self.columns,
            "event_time": "ts",
            "segment_store": self.root,
            "file_partition": self.file_partition,
        }
        self.version, _ = self.store.apply_source(self.name, spec_from_dict(doc).to_json(), "")

    def publish(
        self, records: int, rejects: int = 0, day_span: bool = False, holes: int = 0, partition: int = 0
    ) -> int:
        """One segment of ``records`` rows (and ``rejects`` rejected records) at the partition's
        next offsets; ``holes``: offsets after them with no record (aborted transactions, compaction)."""
        tp = TopicPartition(T0.topic, partition)
        build = uuid.uuid4()
        split = uuid.uuid4()
        dirs = build_dirs(self.root, self.name, build)
        self.store.register_build(
            "w", BuildRegistration(build, self.name, dirs.staging, dirs.data, dirs.rejects, (split,))
        )
        start, end = self.next[tp], self.next[tp] + records + rejects + holes
        files: tuple[str, ...] = ()
        if records:
            offsets = list(range(start, start + records))
            step = timedelta(hours=20) if day_span else timedelta(seconds=1)
            data: dict[str, list[Any]] = {
                "_topic": [T0.topic] * records,
                "_partition": [partition] * records,
                "_offset": offsets,
                "_timestamp": [DAY0] * records,
                "_key": [None] * records,
            }
            for column, ctype in self.columns.items():
                if column == "ts":
                    data[column] = [DAY0 + step * (o - start) for o in offsets]
                elif ctype == "long":
                    data[column] = offsets
                else:
                    data[column] = [f"{column}-{o}" for o in offsets]
            files = (self._write(f"{dirs.data}/part-00000-{split}.parquet", pa.table(data, spark_like(self.columns))),)
        rejects_files: tuple[str, ...] = ()
        if rejects:
            bad = list(range(start + records, start + records + rejects))
            table = pa.table(
                {
                    "_topic": [T0.topic] * rejects,
                    "_partition": [partition] * rejects,
                    "_offset": bad,
                    "_value": [b"{"] * rejects,
                    "_error": ["invalid_json"] * rejects,
                }
            )
            rejects_files = (self._write(f"{dirs.rejects}/part-00000-{split}.parquet", table),)
        segment = BuiltSegment(
            split_id=split,
            location=dirs.data,
            files=files,
            row_count=records,
            size_bytes=1,
            rejects_location=dirs.rejects if rejects else None,
            rejects_files=rejects_files,
            rejects_count=rejects,
        )
        segment_id = self.store.publish(
            SegmentToPublish(
                self.name, self.version, "w", segment, (PublishRange(OffsetRange(tp, start, end), self.serials[tp]),)
            )
        )
        self.next[tp] = end
        return segment_id

    @staticmethod
    def _write(uri: str, table: pa.Table) -> str:
        ensure_parent(uri)
        fs, path = filesystem(uri)
        pq.write_table(table, path, filesystem=fs, compression="zstd")
        return uri

    def published_offsets(self) -> list[int]:
        """Every data row's offset over the published segments' files (what a reader of the
        metastore's list would read)."""
        offsets: list[int] = []
        for segment in self.store.segments(self.name):
            for f in segment["files"]:
                fs, path = filesystem(f)
                offsets += pq.read_table(path, filesystem=fs, columns=["_offset"])["_offset"].to_pylist()
        return sorted(offsets)


def table_offsets(database_url: str, source: str, kind: TableKind = TableKind.DATA) -> list[int]:
    catalog = MetastoreCatalog(database_url)
    try:
        table = catalog.load_table(identifier(source, kind))
        return sorted(table.scan(selected_fields=("_offset",)).to_arrow()["_offset"].to_pylist())
    finally:
        catalog.close()


def assert_exactly_once(database_url: str, src: Source) -> None:
    published = src.published_offsets()
    held = table_offsets(database_url, src.name)
    assert not [o for o, n in Counter(held).items() if n > 1], "a record is in the table twice"
    assert held == published
    with TableStore(database_url) as store:
        assert store.behind(src.name, TableKind.DATA)[0] == 0


@pytest.fixture
def src(database_url: str, tmp_path: Path) -> Iterator[Source]:
    source = Source(database_url, f"file://{tmp_path}/store")
    yield source
    source.store.close()


def committer(database_url: str, source: str, batch: int = 100) -> TableCommitter:
    return TableCommitter(database_url, source, CommitSettings(batch_segments=batch, interval_s=0))


def test_every_published_segment_is_appended_once_in_batches(database_url: str, src: Source) -> None:
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
    assert data_status["location"].endswith(f"/{src.name}/_iceberg/data")
    columns, rows = run_query(database_url, src.name, "SELECT count(*) AS n, count(DISTINCT _offset) FROM clicks")
    assert columns[0] == "n"
    assert rows == [(29, 29)]  # 10 + 5 + 7 + 3 + 4


def test_a_crash_between_the_iceberg_commit_and_its_record_is_reconciled(database_url: str, src: Source) -> None:
    src.publish(10)
    src.publish(10)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:

        def crash(*args: object, **kwargs: object) -> bool:
            raise SystemExit("killed after the Iceberg commit")

        c.store.record_commit = crash  # type: ignore[method-assign]
        with pytest.raises(SystemExit):
            c.commit_all()
    # The table holds commit 1; the metastore recorded nothing.
    with TableStore(database_url) as store:
        assert store.table(src.name, TableKind.DATA).committed_seq == 0
    src.publish(5)
    with committer(database_url, src.name) as c:
        results = c.commit_all()
    # Reconciled first (segments 1, 2 recorded from the table's properties), then only the new one.
    assert [(r.seq, len(r.segment_ids)) for r in results] == [(2, 1)]
    assert_exactly_once(database_url, src)


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


def run_cli(database_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ingest", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "INGEST_DATABASE_URL": database_url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_committer_killed_during_a_commit_loses_and_duplicates_nothing(database_url: str, src: Source) -> None:
    for _ in range(3):
        src.publish(8)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    proc = run_cli(
        database_url,
        "table-commit",
        src.name,
        "--interval",
        "0",
        env={"INGEST_FAULT_TABLE_PAUSE_AT": "iceberg_committed", "INGEST_LOG_FORMAT": "json"},
    )
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:  # ends when the process does: never waits past its exit
            seen.append(line)
            if "table_fault_pause" in line:
                break
        assert any("table_fault_pause" in line for line in seen), "".join(seen)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    src.publish(4)
    once = run_cli(database_url, "table-commit", src.name, "--once", "--json")
    out, _ = once.communicate(timeout=120)
    assert once.returncode == 0, out
    assert_exactly_once(database_url, src)
    # What an operator sees: the table's state and a query, as one JSON document each.
    shown = run_cli(database_url, "table", src.name, "--json")
    doc = json.loads(shown.communicate(timeout=120)[0])
    assert doc["schema_version"] == 1
    assert [(t["table"], t["segments_behind"], t["commits"]) for t in doc["tables"]] == [("data", 0, 2)]
    asked = run_cli(database_url, "query", src.name, "SELECT count(*) AS n FROM clicks", "--json")
    assert json.loads(asked.communicate(timeout=120)[0])["rows"] == [[28]]
    bad = run_cli(database_url, "query", src.name, "SELECT nosuch FROM clicks")
    assert bad.communicate(timeout=120)[0].startswith("ingest: error: query over clicks: Binder Error")
    assert bad.returncode == 2
    refused = run_cli(database_url, "table", "nosuch")
    assert refused.communicate(timeout=120)[0].startswith("ingest: error: unknown source")
    assert refused.returncode == 3


def test_the_committer_rides_out_a_postgresql_restart(tmp_path: Path) -> None:
    with LocalPostgres() as pg:
        url = pg.create_database("t")
        apply_migrations(url)
        src = Source(url, f"file://{tmp_path}/store")
        src.publish(5)
        enable_table(url, src.name, PartitionBy.NONE, RejectsMode.NONE)
        stop = threading.Event()
        c = TableCommitter(url, src.name, CommitSettings(batch_segments=1, interval_s=0, poll_s=0.2))
        runner = threading.Thread(target=c.run, args=(stop,))
        runner.start()
        try:
            assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
            src.store.close()
            pg.restart(crash=True)
            for _ in range(3):
                src.publish(5)
            assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
        finally:
            stop.set()
            runner.join(timeout=60)
            c.close()
        assert_exactly_once(url, src)
        with psycopg.connect(url) as conn:
            # One committer held the lock throughout and released it on stop.
            assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() == (0,)
        src.store.close()


def assert_eventually(check: Any, runner: threading.Thread, attempts: int = 600) -> None:
    """Bounded in count: each attempt waits for the committer thread for 0.1 s at most."""
    for _ in range(attempts):
        try:
            if check():
                return
        except Exception:  # the metastore restarting
            pass
        runner.join(timeout=0.1)
        assert runner.is_alive(), "the committer stopped"
    raise AssertionError("the table did not catch up")


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


def gauge(metrics: Any, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return None if value is None else float(value)


def test_a_second_committer_stands_by_and_takes_over_when_the_first_stops(database_url: str, src: Source) -> None:
    src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    settings = CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1)
    first, second = TableCommitter(database_url, src.name, settings), TableCommitter(database_url, src.name, settings)
    stops = [threading.Event(), threading.Event()]
    runners = [threading.Thread(target=c.run, args=(stop,)) for c, stop in zip((first, second), stops, strict=True)]
    runners[0].start()
    try:
        assert_eventually(
            lambda: gauge(first.metrics, "ingest_table_commits_total", source="clicks", table="data"), runners[0]
        )
        runners[1].start()
        src.publish(2)
        assert_eventually(
            lambda: gauge(first.metrics, "ingest_table_commits_total", source="clicks", table="data") == 2, runners[0]
        )
        # The standby commits nothing and reports what it sees (nothing behind), not active.
        assert_eventually(
            lambda: gauge(second.metrics, "ingest_table_segments_behind", source="clicks", table="data") == 0,
            runners[1],
        )
        assert gauge(second.metrics, "ingest_table_committer_active", source="clicks") == 0
        assert gauge(second.metrics, "ingest_table_commits_total", source="clicks", table="data") == 0
        stops[0].set()
        runners[0].join(timeout=60)
        src.publish(4)
        assert_eventually(
            lambda: gauge(second.metrics, "ingest_table_commits_total", source="clicks", table="data") == 1, runners[1]
        )
        assert gauge(second.metrics, "ingest_table_committer_active", source="clicks") == 1
    finally:
        for stop in stops:
            stop.set()
        for runner in runners:
            if runner.is_alive() or runner.ident is not None:
                runner.join(timeout=60)
        first.close()
        second.close()
    assert_exactly_once(database_url, src)


def test_a_query_before_the_first_commit_says_so_in_one_line(database_url: str, src: Source) -> None:
    from ingest.table.errors import TableError
    from metastore.tables import TableNotEnabled

    with pytest.raises(TableNotEnabled):
        run_query(database_url, src.name, "SELECT 1")
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with pytest.raises(TableError, match="created by the first commit"):
        run_query(database_url, src.name, "SELECT count(*) FROM clicks")


def table_coordinates(database_url: str, source: str, kind: TableKind) -> list[tuple[str, int, int]]:
    """Every row's (_topic, _partition, _offset) as pyiceberg's scan reads them, sorted."""
    catalog = MetastoreCatalog(database_url)
    try:
        rows = (
            catalog.load_table(identifier(source, kind))
            .scan(selected_fields=("_topic", "_partition", "_offset"))
            .to_arrow()
            .to_pylist()
        )
    finally:
        catalog.close()
    return sorted((r["_topic"], r["_partition"], r["_offset"]) for r in rows)


def file_rows(files: list[str]) -> list[tuple[str, str, int, int]]:
    """(file, _topic, _partition, _offset) of every row in the files, read with pyarrow, sorted."""
    rows = []
    for f in files:
        fs, path = filesystem(f)
        table = pq.read_table(path, filesystem=fs, columns=["_topic", "_partition", "_offset"])
        rows += [(f, r["_topic"], r["_partition"], r["_offset"]) for r in table.to_pylist()]
    return sorted(rows)


def test_spark_reads_every_committed_row_once_through_icebergs_jdbc_catalog(
    database_url: str, tmp_path: Path, spark: Any
) -> None:
    """Spark (the product's pyspark with Iceberg's runtime from the project's jar set, in a new
    session on the tests' SparkContext: ingest_dev/iceberg_spark.py) reads both tables through
    Iceberg's JdbcCatalog on the metastore's PostgreSQL: it sees exactly the rows of the
    committed segments' files, each once, the same rows pyiceberg's scan reads, and nothing of a
    segment published after the commit.

    Spark cannot select the column ``_partition`` (Iceberg reserves the name for its metadata
    column and refuses the scan), so it identifies each row by ``_file`` (Iceberg's metadata
    column: the data file it was read from), ``_topic`` and ``_offset``; the Kafka partition of
    each row is then that file's."""
    src = Source(database_url, f"file://{tmp_path}/store", partitions=2)
    try:
        src.publish(10)
        src.publish(6, rejects=2, partition=1)
        src.publish(0, holes=3)
        src.publish(7, partition=1)
        src.publish(5, rejects=1)
        enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
        with committer(database_url, src.name, batch=2) as c:
            assert c.commit_all()
        committed = src.store.segments(src.name)
        late = src.publish(4, partition=1)  # published, not committed: no reader of the table sees it yet
        late_files = {f for s in src.store.segments(src.name) if s["id"] == late for f in s["files"]}
        tables = {kind: spark_table(src.name, kind) for kind in TableKind}
        seen = read_tables(database_url, list(tables.values()), coordinates=True, spark=spark)
    finally:
        src.store.close()
    assert seen["spark_version"] == spark.version
    for kind, files_key, count_key, partitions in (
        (TableKind.DATA, "files", "row_count", {("events", 0): 15, ("events", 1): 13}),
        (TableKind.REJECTS, "rejects_files", "rejects_count", {("events", 0): 1, ("events", 1): 2}),
    ):
        spark = seen["tables"][tables[kind]]
        assert set(spark["refused_columns"]) == {"_partition"}, spark["refused_columns"]
        assert spark["key"] == ["_topic", "_offset"]
        expected = file_rows([f for s in committed for f in s[files_key]])
        assert spark["rows"] == len(expected) == sum(s[count_key] for s in committed) == sum(partitions.values())
        assert spark["distinct_file_keys"] == spark["rows"]  # no row twice
        assert spark["files"] == len({f for f, *_ in expected})
        # Row for row the committed files' rows, each once: a row of another file (the late
        # segment's), a missing row or a row read twice would differ here.
        partition_of = {(f, t, o): p for f, t, p, o in expected}
        spark_rows = sorted((f, t, partition_of[(f, t, o)], o) for f, t, o in spark["coordinates"])
        assert spark_rows == expected
        assert not {f for f, *_ in spark_rows} & late_files
        coordinates = sorted((t, p, o) for _, t, p, o in spark_rows)
        assert coordinates == table_coordinates(database_url, src.name, kind)
        assert len(set(coordinates)) == len(coordinates)
        assert Counter((t, p) for t, p, _ in coordinates) == partitions
