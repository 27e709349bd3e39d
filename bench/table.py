"""What an Iceberg table commit costs (``python -m bench.table``; no Kafka, no Spark, ~1 min).

Publishes synthetic segments (one Parquet file each, shaped like the builder's output: the meta
columns and five more, no Iceberg field ids) into a local PostgreSQL, then appends them to the
source's table with the committer at several batch sizes: commit latency (reconcile, schema
check, add_files, catalog swap, metastore record), the cost per segment, and how the latency
grows with the number of commits the table already holds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.segments.store import build_dirs, ensure_parent
from ingest.spec import spec_from_dict
from ingest.table.committer import CommitResult, TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.postgres import LocalPostgres
from metastore import Metastore, apply_migrations

TP = TopicPartition("events", 0)
T0 = datetime(2026, 11, 24, tzinfo=UTC)


def publish_segments(store: Metastore, source: str, root: str, count: int, rows: int) -> None:
    store.apply_source(
        source,
        spec_from_dict(
            {
                "name": source,
                "topics": [TP.topic],
                "schema": {"id": "long", "user": "string", "ts": "timestamp", "amount": "double", "page": "string"},
                "event_time": "ts",
                "segment_store": root,
            }
        ).to_json(),
        "",
    )
    store.register_partitions(source, TP.topic, [0], "earliest")
    serial = store.claim_from(source, "bench", [TP], start=0)[TP].serial
    for n in range(count):
        build, split = uuid.uuid4(), uuid.uuid4()
        dirs = build_dirs(root, source, build)
        store.register_build("bench", BuildRegistration(build, source, dirs.staging, dirs.data, dirs.rejects, (split,)))
        offsets = list(range(n * rows, (n + 1) * rows))
        table = pa.table(
            {
                "_topic": [TP.topic] * rows,
                "_partition": pa.array([0] * rows, pa.int32()),
                "_offset": offsets,
                "_timestamp": pa.array([T0] * rows, pa.timestamp("us", tz="UTC")),
                "_key": pa.array([None] * rows, pa.binary()),
                "id": offsets,
                "user": [f"u{o % 97}" for o in offsets],
                "ts": pa.array([T0 + timedelta(milliseconds=o) for o in offsets], pa.timestamp("us", tz="UTC")),
                "amount": [o * 0.5 for o in offsets],
                "page": [f"/p/{o % 13}" for o in offsets],
            }
        )
        uri = f"{dirs.data}/part-00000-{split}.zstd.parquet"
        ensure_parent(uri)
        pq.write_table(table, uri.removeprefix("file://"), compression="zstd")
        segment = BuiltSegment(split, dirs.data, (uri,), rows, 1)
        store.publish(
            SegmentToPublish(
                source, 1, "bench", segment, (PublishRange(OffsetRange(TP, n * rows, (n + 1) * rows), serial),)
            )
        )


def measure(url: str, root: str, source: str, segments: int, batch: int, rows: int) -> list[CommitResult]:
    with Metastore(url) as store:
        publish_segments(store, source, root, segments, rows)
    enable_table(url, source, PartitionBy.NONE, RejectsMode.NONE)
    with TableCommitter(url, source, CommitSettings(batch_segments=batch, interval_s=0)) as committer:
        return committer.commit_all()


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.table", description=__doc__)
    parser.add_argument("--segments", type=int, default=200, help="segments per run (default %(default)s)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per segment (default %(default)s)")
    args = parser.parse_args(argv)
    print(f"{args.segments} segments of {args.rows} rows, one file each, per run")
    print(
        f"{'batch':>5} {'commits':>7} {'p50 ms':>8} {'p95 ms':>8} {'ms/segment':>10} "
        f"{'first 10 p50':>12} {'last 10 p50':>11}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-table-") as tmp, LocalPostgres() as pg:
        for batch in (1, 10, 100):
            url = pg.create_database(f"bench_{batch}")
            apply_migrations(url)
            started = time.monotonic()
            results = measure(url, f"file://{Path(tmp)}/store{batch}", "clicks", args.segments, batch, args.rows)
            wall = time.monotonic() - started
            seconds = [r.seconds for r in results]
            per_segment = 1000 * sum(seconds) / sum(len(r.segment_ids) for r in results)
            first = statistics.median(seconds[:10]) * 1000
            last = statistics.median(seconds[-10:]) * 1000
            print(
                f"{batch:>5} {len(results):>7} {ms(seconds, 0.5):>8.1f} {ms(seconds, 0.95):>8.1f} "
                f"{per_segment:>10.2f} {first:>12.1f} {last:>11.1f}   (run incl. publishing: {wall:.1f} s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
