"""What the Iceberg table tests share: a source whose segments are published as a worker publishes
them (without Kafka or Spark), the committer they run, the exactly-once check of its table, and
the command line, eventual and metric helpers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.ops.audit import audit_source
from ingest.segments.store import build_dirs, ensure_parent, filesystem
from ingest.spec.parse import spec_from_dict
from ingest.table import committer as committer_module
from ingest.table.audit import table_findings
from ingest.table.catalog import MetastoreCatalog, close_catalog, identifier, source_catalog
from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.process import popen
from metastore import Metastore
from metastore.tables import TableKind, TableStore

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

    def __init__(
        self,
        database_url: str,
        root: str,
        name: str = "clicks",
        partitions: int = 1,
        catalog: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.root = root
        # The spec's [table] catalog (None: the metastore's own).
        self.catalog = catalog
        self.store = Metastore(database_url)
        self.columns = dict(COLUMNS)
        self.event_time = "ts"
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
            "event_time": self.event_time,
            "segment_store": self.root,
            "file_partition": self.file_partition,
            **({"table": {"catalog": self.catalog}} if self.catalog else {}),
        }
        self.version, _ = self.store.apply_source(self.name, spec_from_dict(doc).to_json(), "")

    def publish(
        self, records: int, rejects: int = 0, day_span: bool = False, holes: int = 0, partition: int = 0, day: int = 0
    ) -> int:
        """One segment of ``records`` rows (and ``rejects`` rejected records) at the partition's
        next offsets; ``holes``: offsets after them with no record (aborted transactions, compaction).
        Event times from ``day`` days after DAY0 on, a second apart (``day_span``: 20 hours apart)."""
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
                    data[column] = [DAY0 + timedelta(days=day) + step * (o - start) for o in offsets]
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
            holes=holes,
        )
        segment_id = self.store.publish(
            SegmentToPublish(
                self.name, self.version, "w", segment, (PublishRange(OffsetRange(tp, start, end), self.serials[tp]),)
            )
        )
        self.next[tp] = end
        return segment_id

    def publish_built(self, built: BuiltSegment, end: int, partition: int = 0) -> int:
        """Publish a segment a real builder built (its files where it wrote them) over the
        partition's next offsets up to ``end``."""
        tp = TopicPartition(T0.topic, partition)
        dirs = build_dirs(self.root, self.name, built.split_id)
        self.store.register_build(
            "w", BuildRegistration(built.split_id, self.name, dirs.staging, dirs.data, dirs.rejects, (built.split_id,))
        )
        ranges = (PublishRange(OffsetRange(tp, self.next[tp], end), self.serials[tp]),)
        segment_id = self.store.publish(SegmentToPublish(self.name, self.version, "w", built, ranges))
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
    """Every row's offset as pyiceberg's scan reads the table, in the catalog its spec names."""
    catalog = source_catalog(database_url, source)
    try:
        table = catalog.load_table(identifier(source, kind))
        return sorted(table.scan(selected_fields=("_offset",)).to_arrow()["_offset"].to_pylist())
    finally:
        close_catalog(catalog)


def assert_exactly_once(database_url: str, src: Source) -> None:
    published = src.published_offsets()
    held = table_offsets(database_url, src.name)
    assert not [o for o, n in Counter(held).items() if n > 1], "a record is in the table twice"
    assert held == published
    with TableStore(database_url) as store:
        assert store.behind(src.name, TableKind.DATA)[0] == 0


def committer(database_url: str, source: str, batch: int = 100) -> TableCommitter:
    return TableCommitter(database_url, source, CommitSettings(batch_segments=batch, interval_s=0))


def run_cli(database_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return popen(
        [sys.executable, "-m", "ingest", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "INGEST_DATABASE_URL": database_url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


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


def gauge(metrics: Any, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return None if value is None else float(value)


def compact(src: Source, old: list[int]) -> int:
    """What ``ingest compact`` does, without Spark: a build registered, the old segments' rows
    written as one file sorted by offset, then the replacement."""
    segments = {s["id"]: s for s in src.store.segments(src.name)}
    build, split = uuid.uuid4(), uuid.uuid4()
    dirs = build_dirs(src.root, src.name, build)
    src.store.register_build("c", BuildRegistration(build, src.name, dirs.staging, dirs.data, dirs.rejects, (split,)))
    parts = []
    for uri in (f for i in old for f in segments[i]["files"]):
        fs, path = filesystem(uri)
        parts.append(pq.read_table(path, filesystem=fs))
    rows = sum(int(segments[i]["row_count"]) for i in old)
    files = []
    if parts:
        merged = pa.concat_tables(parts).sort_by("_offset")
        files.append(Source._write(f"{dirs.data}/part-00000-{split}.parquet", merged))
    return src.store.replace_segments(src.name, split, "c", old, dirs.data, files, rows, 1)


def table_files(c: TableCommitter, kind: TableKind = TableKind.DATA) -> set[str]:
    table = c.load(kind)
    assert table is not None
    return {task.file.file_path for task in table.scan().plan_files()}


def audit_findings(database_url: str, source: str) -> list[str]:
    """Every line ``ingest audit --files`` prints for its findings."""
    with Metastore(database_url) as store:
        result, snapshot = audit_source(store, source, files=True)
    _tables, found = table_findings(database_url, source, snapshot)
    return [f.line() for f in result.findings] + [f"{kind}: {where}: {detail}" for kind, where, detail in found]


class Crashed(Exception):
    """A committer's death, injected where it would leave a commit unrecorded."""


def commit_unrecorded(c: TableCommitter, kind: TableKind = TableKind.DATA) -> None:
    """One commit of ``c`` that reaches the table and not the metastore: what a committer that
    died between its catalog swap and its record leaves. The metastore's catalog records in
    the swap, so there the record is taken out of it (a committer that recorded after its swap);
    another catalog's committer records after the swap, and dies there."""
    if isinstance(c.catalog, MetastoreCatalog):
        with _patched(committer_module, "fence_commit", lambda conn, commit, url: None):
            assert c.commit_batch(kind) is not None
        return

    def crash(*args: Any, **kwargs: Any) -> bool:
        raise Crashed("died between the catalog's swap and its record")

    with _patched(c.store, "record_commit", crash):
        try:
            c.commit_batch(kind)
        except Crashed:
            return
    raise AssertionError("the commit was not attempted")


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    real = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, real)
