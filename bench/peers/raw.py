"""The raw baseline: consume everything, parse the JSON with pyarrow, write Parquet. No guarantees.

No offsets stored anywhere, no Spark, no metastore: the ceiling of "Kafka → Parquet" on this
machine with the same client library (confluent-kafka) and the same output columns as the
ingest segments (``_topic``, ``_partition``, ``_offset``, ``_timestamp``, ``_key``, then the
schema's columns, zstd).  Runs as its own process so that its CPU and memory are its own:

    python -m bench.peers.raw --bootstrap H:P --topic T --ends '{"0": 3334, ...}' --out DIR --result FILE
    python -m bench.peers.raw --bootstrap H:P --topic T --follow --flush-s S --stop FILE --out DIR --result FILE

``--follow`` is the freshness run's form (bench/freshness/phase.py): it reads until ``FILE`` exists and
writes what it holds once its oldest record has waited ``S`` seconds (or ``--batch`` records are
held), each file written under a temporary name and renamed, so a file's mtime is when its rows
became visible.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from bench.data import SCHEMA

_ARROW_TYPES: dict[str, Any] = {
    "long": pa.int64(),
    "string": pa.string(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "double": pa.float64(),
    "array<string>": pa.list_(pa.string()),
}


def arrow_schema() -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in SCHEMA.items()])


_PARSE_OPTIONS = pa_json.ParseOptions(explicit_schema=arrow_schema(), unexpected_field_behavior="ignore")


def parse_values(values: bytes) -> pa.Table:
    """Newline-joined JSON values as a table of the benchmark's schema (other fields ignored)."""
    return pa_json.read_json(io.BytesIO(values), parse_options=_PARSE_OPTIONS)


def cpu_seconds() -> float:
    """CPU (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class BatchWriter:
    """Turns a batch of messages into one zstd Parquet file."""

    def __init__(self, out_dir: Path) -> None:
        self._out_dir = out_dir
        self.files = 0
        self.rows = 0
        self.bytes = 0

    def write(self, topic: str, messages: list[Any]) -> Path:
        table = parse_values(b"\n".join(m.value() for m in messages))
        n = len(messages)
        kafka = pa.table(
            {
                "_topic": pa.array([topic] * n, pa.string()),
                "_partition": pa.array([m.partition() for m in messages], pa.int32()),
                "_offset": pa.array([m.offset() for m in messages], pa.int64()),
                "_timestamp": pa.array([m.timestamp()[1] for m in messages], pa.timestamp("ms", tz="UTC")),
                "_key": pa.array([m.key() for m in messages], pa.binary()),
            }
        )
        for name in table.column_names:
            kafka = kafka.append_column(name, table[name])
        path = self._out_dir / f"part-{self.files:05d}.parquet"
        # Written whole, then renamed: a reader never sees part of a file.
        tmp = path.with_suffix(".tmp")
        pq.write_table(kafka, tmp, compression="zstd")
        tmp.replace(path)
        self.files += 1
        self.rows += n
        self.bytes += path.stat().st_size
        return path


def _subscribed(bootstrap: str, topic: str, out_dir: Path) -> tuple[Any, BatchWriter]:
    """A consumer of a fresh group subscribed to the topic (from earliest, like every other system
    in the bench), and a writer into ``out_dir``."""
    from confluent_kafka import Consumer

    out_dir.mkdir(parents=True, exist_ok=True)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    consumer.subscribe([topic])
    return consumer, BatchWriter(out_dir)


def run(bootstrap: str, topic: str, ends: dict[int, int], out_dir: Path, batch: int, timeout: float) -> dict[str, Any]:
    consumer, writer = _subscribed(bootstrap, topic, out_dir)
    # Done when every partition delivered its last offset (Kafka's end offsets, which the
    # parent checked against the producer's delivery reports).
    remaining = {p: end for p, end in ends.items() if end > 0}
    pending: list[Any] = []
    first_at: float | None = None
    first_cpu = 0.0
    deadline = time.monotonic() + timeout
    try:
        while remaining and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            for m in messages:
                if m.error() is not None:
                    continue
                if first_at is None:
                    first_at = time.time()
                    first_cpu = cpu_seconds()
                pending.append(m)
                p, offset = m.partition(), m.offset()
                if p in remaining and offset is not None and offset + 1 >= remaining[p]:
                    del remaining[p]
            if len(pending) >= batch or (pending and not remaining):
                writer.write(topic, pending)
                pending = []
        last_at = time.time()
        last_cpu = cpu_seconds()
    finally:
        consumer.close()
    return {
        "ok": not remaining,
        "first_record_at": first_at,
        "last_write_at": last_at,
        "rows": writer.rows,
        "files": writer.files,
        "file_bytes": writer.bytes,
        "cpu_s": last_cpu - first_cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "missing_partitions": sorted(remaining),
    }


def follow(
    bootstrap: str, topic: str, out_dir: Path, flush_s: float, batch: int, stop: Path, timeout: float
) -> dict[str, Any]:
    """Read from the earliest offset until ``stop`` exists (bounded by ``timeout``); what is held
    is written once its oldest record has waited ``flush_s`` (or ``batch`` records are held)."""
    consumer, writer = _subscribed(bootstrap, topic, out_dir)
    pending: list[Any] = []
    oldest = 0.0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not stop.exists():
            for m in consumer.consume(num_messages=10_000, timeout=0.05):
                if m.error() is None:
                    if not pending:
                        oldest = time.monotonic()
                    pending.append(m)
            if pending and (len(pending) >= batch or time.monotonic() - oldest >= flush_s):
                writer.write(topic, pending)
                pending = []
    finally:
        consumer.close()
    return {"ok": True, "rows": writer.rows, "files": writer.files, "file_bytes": writer.bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.raw", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ends", help="JSON object: partition -> log end offset (without --follow)")
    parser.add_argument("--follow", action="store_true", help="read until --stop exists, flushing every --flush-s")
    parser.add_argument("--flush-s", type=float, default=2.5)
    parser.add_argument("--stop", type=Path, help="(--follow) stop once this file exists")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=200_000, help="records per Parquet file")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--result", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.follow:
        if args.stop is None:
            parser.error("--follow needs --stop")
        result = follow(args.bootstrap, args.topic, args.out, args.flush_s, args.batch, args.stop, args.timeout)
    else:
        if args.ends is None:
            parser.error("--ends is required without --follow")
        ends = {int(p): int(e) for p, e in json.loads(args.ends).items()}
        result = run(args.bootstrap, args.topic, ends, args.out, args.batch, args.timeout)
    args.result.write_text(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
