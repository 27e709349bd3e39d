"""``python -m bench.store``: what a split costs to build and to publish on a local file store
and on an S3 store, side by side in one process.

Both stores are written by the worker's own path: ``SparkSegmentBuilder.build_batch`` (the
build registered in the metastore first, Spark writing through the file system or S3A and its
magic committer) and ``Metastore.publish`` (one transaction). The S3 API is a local one (moto's
server mode, ``ingest_dev.s3.LocalS3``) on loopback: it shows the protocol's cost (requests
per build, multipart uploads, listing, no copies), not a network's latency. Rounds alternate
between the stores so that drift of the machine hits both alike; a warm-up on each store comes
first. Prints per store: build seconds per batch and per split, records/s, publish p50/p99, and
the S3 requests a batch makes by method.

    python -m bench.store [--records 10000] [--splits 4] [--rounds 6] [--out store.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.data import EVENT_TIME, SCHEMA, record_value
from bench.stats import percentiles
from ingest.builder.job import SparkSegmentBuilder
from ingest.builder.registration import Registrar
from ingest.logs import configure_logging
from ingest.spark.session import create_session
from ingest.spec import SourceSpec, spec_from_dict
from ingest.splits.chunks import chunks_of
from ingest.splits.split import KillSwitch, SealedSplit, SyntheticRecord
from ingest_common.model import (
    BuiltSegment,
    OffsetRange,
    PartitionClaim,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.postgres import LocalPostgres
from ingest_dev.s3 import LocalS3
from metastore import Metastore, apply_migrations

TOPIC = "events"
TIME_BOUND_S = 1800.0


@dataclass
class StoreRun:
    """One store's source, claims and figures."""

    kind: str
    spec: SourceSpec
    version: int
    claims: dict[TopicPartition, PartitionClaim]
    builder: SparkSegmentBuilder
    local_s3: LocalS3 | None = None
    next_offset: dict[TopicPartition, int] = field(default_factory=dict)
    build_s: list[float] = field(default_factory=list)
    publish_ms: list[float] = field(default_factory=list)
    requests: list[Counter[str]] = field(default_factory=list)
    bytes_written: int = 0


def _spec(name: str, store: str) -> SourceSpec:
    return spec_from_dict(
        {
            "name": name,
            "topics": [TOPIC],
            "event_time": EVENT_TIME,
            "segment_store": store,
            "on_parse_error": "reject",
            "schema": SCHEMA,
        }
    )


def _batch(run: StoreRun, splits: int, records: int, values: list[bytes]) -> list[SealedSplit]:
    batch = []
    now = time.monotonic()
    for p in range(splits):
        tp = TopicPartition(TOPIC, p)
        start = run.next_offset.get(tp, 0)
        run.next_offset[tp] = start + records
        batch.append(
            SealedSplit(
                id=uuid.uuid4(),
                tp=tp,
                serial=run.claims[tp].serial,
                start=start,
                end=start + records,
                chunks=chunks_of([SyntheticRecord(start + i, values[i]) for i in range(records)]),
                size_bytes=sum(len(v) for v in values[:records]),
                first_record_at=now,
                sealed_at=now,
                seal_reason="bench",
                kill_switch=KillSwitch(),
            )
        )
    return batch


def _round(run: StoreRun, store: Metastore, splits: int, records: int, values: list[bytes]) -> None:
    batch = _batch(run, splits, records, values)
    if run.local_s3 is not None:
        run.local_s3.record(True)
    started = time.perf_counter()
    results = run.builder.build_batch(batch, run.spec)
    run.build_s.append(time.perf_counter() - started)
    if run.local_s3 is not None:
        run.requests.append(Counter(r["method"] for r in run.local_s3.requests()))
        run.local_s3.record(False)
    for split, result in zip(batch, results, strict=True):
        if not isinstance(result, BuiltSegment):
            raise RuntimeError(f"{run.kind}: a build failed: {result!r}")
        run.bytes_written += result.size_bytes
        item = SegmentToPublish(
            source=run.spec.name,
            spec_version=run.version,
            worker_id="bench",
            segment=result,
            ranges=(PublishRange(OffsetRange(split.tp, split.start, split.end), split.serial),),
        )
        started = time.perf_counter()
        store.publish(item)
        run.publish_ms.append((time.perf_counter() - started) * 1000)


def _summary(run: StoreRun, splits: int, records: int) -> dict[str, Any]:
    builds = sorted(run.build_s)
    median = builds[len(builds) // 2]
    out: dict[str, Any] = {
        "batches": len(builds),
        "build_s_per_batch": {"p50": round(median, 3), "max": round(builds[-1], 3)},
        "build_s_per_split_p50": round(median / splits, 3),
        "records_per_s_p50": round(splits * records / median),
        "publish_ms": percentiles(run.publish_ms),
        "mb_written_per_batch": round(run.bytes_written / len(builds) / 1e6, 2),
    }
    if run.requests:
        methods = sorted({m for c in run.requests for m in c})
        out["s3_requests_per_batch"] = {
            m: round(sum(c[m] for c in run.requests) / len(run.requests), 1) for m in methods
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000, help="records per split (default 10000)")
    parser.add_argument("--splits", type=int, default=4, help="splits per batch, one Spark job (default 4)")
    parser.add_argument("--rounds", type=int, default=6, help="timed batches per store (default 6)")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    configure_logging(level=logging.WARNING)
    values = [record_value(i) for i in range(args.records)]
    results: dict[str, Any] = {
        "records_per_split": args.records,
        "splits_per_batch": args.splits,
        "rounds": args.rounds,
        "machine": f"{os.cpu_count()} cores",
    }
    with LocalPostgres() as pg, LocalS3() as s3, tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        os.environ.update(s3.env)  # S3A (through ingest.spark.session) and pyarrow read the usual AWS variables
        url = pg.create_database("bench_store")
        apply_migrations(url)
        stores = {"file": Path(tmp).resolve().as_uri(), "s3": s3.uri("bench")}
        spark = create_session("local[2]", "bench-store", {"spark.driver.memory": "2g"}, stores=stores.values())
        with Metastore(url) as store, Metastore(url) as register_store:
            runs = []
            for kind, uri in stores.items():
                spec = _spec(f"bench_{kind}", uri)
                version, _ = store.apply_source(spec.name, spec.to_json(), f"# bench.store {kind}")
                store.register_partitions(spec.name, TOPIC, range(args.splits), "earliest")
                claims = store.claim_from(
                    spec.name, "bench", [TopicPartition(TOPIC, p) for p in range(args.splits)], start=0
                )
                builder = SparkSegmentBuilder(spark, Registrar(register_store, "bench"))
                builder.warm_up(spec, 2 * args.records, splits=args.splits)
                runs.append(StoreRun(kind, spec, version, claims, builder, s3 if kind == "s3" else None))
            for run in runs:  # one untimed round each: the first S3A job loads its classes
                _round(run, store, args.splits, args.records, values)
                run.build_s.clear()
                run.publish_ms.clear()
                run.requests.clear()
                run.bytes_written = 0
            deadline = time.monotonic() + TIME_BOUND_S
            for _ in range(args.rounds):
                for run in runs:
                    if time.monotonic() < deadline:
                        _round(run, store, args.splits, args.records, values)
            for run in runs:
                results[run.kind] = _summary(run, args.splits, args.records)
        spark.stop()
    for kind in ("file", "s3"):
        r = results[kind]
        line = (
            f"{kind:>4}: build {r['build_s_per_batch']['p50']:.2f} s per batch of {args.splits} x "
            f"{args.records} records ({r['build_s_per_split_p50']:.3f} s per split, "
            f"{r['records_per_s_p50']:,} records/s), publish p50 {r['publish_ms']['p50']:.2f} ms "
            f"p99 {r['publish_ms']['p99']:.2f} ms, {r['mb_written_per_batch']} MB per batch"
        )
        if "s3_requests_per_batch" in r:
            line += ", S3 requests per batch: " + ", ".join(f"{m} {n:g}" for m, n in r["s3_requests_per_batch"].items())
        print(line)
    ratio = results["s3"]["build_s_per_batch"]["p50"] / results["file"]["build_s_per_batch"]["p50"]
    results["s3_build_time_vs_file"] = round(ratio, 2)
    print(f"s3 build time / file build time: {ratio:.2f}x (median batch, {args.rounds} rounds each, alternating)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
