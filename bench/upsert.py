"""``python -m bench.upsert``: what an upsert table costs (issue 41's figures).

    python -m bench.upsert [--records 1000000] [--partitions 2] [--split-records 100000]
                           [--batch-segments 100] [--quick] [--out DIR]
                           [--database-url URL --bootstrap HOST:PORT] [--keep]

Starts a private PostgreSQL and Apache Kafka (127.0.0.1 only) unless ``--database-url`` and
``--bootstrap`` name running ones. Produces the bench's records (``bench.data``: keyed by user,
50,000 keys, so every key changes ``records / 50,000`` times), ingests them with one worker into
a source whose table is ``mode = "upsert"`` keyed by the Kafka key, then runs ``ingest
table-commit SOURCE --once`` as a process of its own (it starts its Spark session, merges
every published segment's changes with MERGE INTO, folds the delete files back) and measures
its wall time and CPU (process tree with its JVM). Then checks the table read back (pyiceberg)
holds one row per key, each the key's last record in the topic, and ``ingest audit --files``.
Prints one table, writes ``DIR/upsert.json``; exit 1 when a check failed. ``--quick`` (20,000
records in splits of 5,000, merged one segment per partition at a time: two merges) is the CI
smoke size (not in CI for its budget: tests/acceptance/test_upsert_cdc.py runs the same path).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.compaction import run_audit, run_on_servers, run_timed
from bench.console import log
from bench.data import produce_dataset, record_key, record_value
from bench.ingest_runs import Context, SplitConfig, run_throughput
from ingest.table.catalog import close_catalog, identifier, source_catalog
from ingest_dev.kafka_clients import create_topic
from metastore.tables import TableKind

KEYS = 50_000  # bench.data.record_key: user-00000 .. user-49999


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.upsert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, help="records to produce (default 1,000,000; --quick 20,000)")
    parser.add_argument("--partitions", type=int, default=2, help="topic partitions, dividing 50,000 (default 2)")
    parser.add_argument("--split-records", type=int, help="split max_records (default 100,000; --quick 5,000)")
    parser.add_argument(
        "--batch-segments", type=int, help="table-commit --batch-segments, per partition (default 100; --quick 1)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on each phase, seconds")
    parser.add_argument("--driver-memory", default="2g", help="Spark driver memory of the worker (default 2g)")
    parser.add_argument("--quick", action="store_true", help="20,000 records, two merges: a smoke size")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets upsert.json")
    parser.add_argument("--database-url", help="a running PostgreSQL database to use (migrated here)")
    parser.add_argument("--bootstrap", help="a running Kafka to use (a topic of its own is created)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, segments)")
    args = parser.parse_args(argv)
    args.records = args.records or (20_000 if args.quick else 1_000_000)
    args.split_records = args.split_records or (5_000 if args.quick else 100_000)
    args.batch_segments = args.batch_segments or (1 if args.quick else 100)
    if (args.database_url is None) != (args.bootstrap is None):
        parser.error("--database-url and --bootstrap go together")
    if args.partitions <= 0 or KEYS % args.partitions:
        parser.error("--partitions must divide 50,000 (each key on one partition)")
    return args


def expected_state(records: int) -> dict[str, str]:
    """Each key's last record (bench.data: record i has key user-(i % 50,000); one partition per
    key under the default partitioner, so the highest i of a key is its last in Kafka too)."""
    return {
        record_key(i).decode(): json.loads(record_value(i))["session"] for i in range(max(0, records - KEYS), records)
    }


def table_state(database_url: str, source: str) -> tuple[int, dict[str, str]]:
    catalog = source_catalog(database_url, source)
    try:
        table = catalog.load_table(identifier(source, TableKind.DATA))
        rows = table.scan(selected_fields=("_key_string", "session")).to_arrow()
    finally:
        close_catalog(catalog)
    keys = rows["_key_string"].to_pylist()
    return len(keys), dict(zip(keys, rows["session"].to_pylist(), strict=True))


def run(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"upsert-{uuid.uuid4().hex[:8]}"
    create_topic(ctx.bootstrap, topic, args.partitions)
    data = produce_dataset(ctx.bootstrap, topic, args.records, args.partitions, timeout=max(120.0, args.records / 5000))
    log(f"produced {data.records:,} records ({min(args.records, KEYS):,} keys) to {topic} in {data.seconds:.1f} s")
    split = SplitConfig(max_records=args.split_records, max_age="2s")
    upsert = {"key_format": "string", "table": {"mode": "upsert", "key": ["_key_string"]}}
    ingest, fleet = run_throughput(ctx, topic, data, 1, "local[2]", 2, split, "upsert", spec_extra=upsert)
    fleet.stop()
    source = ingest["source"]
    log(f"ingested by one worker in {ingest['wall_s']:.1f} s; {ingest['segments']} segments; merging")
    run_timed(ctx, "table-enable", "table-enable", source)
    commit = run_timed(ctx, "table-commit", "table-commit", source, "--once", "--json", "--batch-segments",
                       str(args.batch_segments))  # fmt: skip
    commits = json.loads(commit.stdout[commit.stdout.find("{") :])["commits"]
    rows, state = table_state(ctx.database_url, source)
    expected = expected_state(args.records)
    audit = run_audit(ctx, source)
    merged = [c for c in commits if c["table"] == "data"]
    return {
        "source": source,
        "records": data.records,
        "keys": len(expected),
        "ingest": {k: ingest[k] for k in ("wall_s", "records_per_s", "cpu_s", "segments")},
        "commit": {
            "wall_s": commit.wall_s,
            "cpu_s": commit.cpu_s,
            "merges": len(merged),
            "merge_seconds": [c["seconds"] for c in merged],
            "changes_per_s": data.records / commit.wall_s,
            "cpu_s_per_million_changes": commit.cpu_s / (data.records / 1e6),
        },
        "table_rows": rows,
        "last_state_ok": rows == len(expected) and state == expected,
        "audit": audit,
    }


def report(result: dict[str, Any]) -> str:
    c = result["commit"]
    merge = c["merge_seconds"]
    return (
        f"upsert table: {result['records']:,} changes of {result['keys']:,} keys, "
        f"{result['ingest']['segments']} segments (ingested at {result['ingest']['records_per_s']:,.0f} records/s)\n"
        f"ingest table-commit --once: wall {c['wall_s']:.1f} s, CPU {c['cpu_s']:.1f} s (process tree with its JVM), "
        f"{c['merges']} merge(s) {', '.join(f'{s:.1f}' for s in merge)} s -> "
        f"{c['changes_per_s']:,.0f} changes/s, {c['cpu_s_per_million_changes']:.1f} CPU s per million changes\n"
        f"table: {result['table_rows']:,} rows, last state per key "
        f"{'ok' if result['last_state_ok'] else 'WRONG'}; ingest audit --files: "
        f"{'passed' if result['audit']['ok'] else 'FAILED'} ({result['audit']['findings']} finding(s))"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {
        "records": args.records,
        "partitions": args.partitions,
        "split_records": args.split_records,
        "batch_segments": args.batch_segments,
        "quick": args.quick,
    }
    result = run_on_servers(args, "upsert", run, settings, report)
    return 0 if result["last_state_ok"] and result["audit"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
