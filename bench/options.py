"""The flags of ``python -m bench`` and their defaults (``--quick`` trims sizes and waits), checked
before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.freshness import phase as freshness


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Ingest against a raw baseline and a peer, on one broker and one pre-produced data set.",
    )
    parser.add_argument("--records", type=int, help="records to pre-produce (default 1,000,000; --quick 20,000)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", type=int, help="workers of the N-worker run (default 3; --quick 2)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets results.json and chart.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes for CI: 20k records, 2 workers, max_age 2s, a 6 s steady phase; "
        "the peer is skipped if not installed",
    )
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--peer-python", help="Python with quixstreams installed (default: the --setup-peer venv)")
    parser.add_argument(
        "--skip-spark", action="store_true", help="skip the Spark Structured Streaming peer (throughput and latency)"
    )
    parser.add_argument(
        "--saturate",
        action="store_true",
        help="run one busy-loop process per CPU during the produce-to-visible phases (both cores saturated)",
    )
    parser.add_argument("--setup-peer", action="store_true", help="create the Quix Streams peer's virtualenv and exit")
    parser.add_argument("--split-records", type=int, default=200_000, help="split max_records (per partition)")
    parser.add_argument("--max-age", help="split max_age, also the peer's commit interval (default 3s; --quick 2s)")
    parser.add_argument("--rate", type=float, help="steady produce rate, records/s (default 2000; --quick 1000)")
    parser.add_argument("--steady-seconds", type=float, help="steady produce duration (default 30; --quick 6)")
    parser.add_argument("--driver-memory", help="Spark driver memory per worker (default 2g; --quick 1g)")
    parser.add_argument("--timeout", type=float, help="bound on each phase, seconds (default 1800; --quick 150)")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="INGEST_NAME=VALUE",
        help="a worker setting for every ingest run (repeatable), e.g. INGEST_WARM_UP_RECORDS=60000",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, segments)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the raw baseline, the peer and the one-worker ingest this many times each and "
        "report the median run of each (the runs' records/s are listed too)",
    )
    parser.add_argument(
        "--format",
        choices=("json", "avro"),
        default="json",
        help="the records' format; avro: the Confluent wire format through a schema registry the bench "
        "starts, for the workers and Spark Structured Streaming (from_avro) only (bench/avro_wire.py)",
    )
    parser.add_argument(
        "--freshness",
        action="store_true",
        help="also the equal-freshness phase (bench/freshness/phase.py); it replaces the Spark peer's "
        "own produce-to-visible phase, which it measures per record at several rates",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one worker over a topic of --records records, per thread and Python function "
        "(bench/profiling/worker.py; alone: python -m bench.worker_profile)",
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="also the fleet comparison (bench/fleet.py): one worker, then --fleet-workers workers with "
        "local Spark, then as many thin workers on one Spark Connect server, each over its own copy of "
        "the data set (--quick: the two fleets only; alone: python -m bench.fleet)",
    )
    parser.add_argument("--fleet-workers", type=int, help="workers of each --fleet fleet (default 3; --quick 2)")
    parser.add_argument(
        "--connect-master", default="local[2]", help="the --fleet Spark Connect server's master (default local[2])"
    )
    freshness.add_arguments(parser)
    args = parser.parse_args(argv)
    quick = args.quick
    args.records = args.records or (20_000 if quick else 1_000_000)
    args.rate = args.rate or (1000.0 if quick else 2000.0)
    args.steady_seconds = args.steady_seconds or (6.0 if quick else 30.0)
    # --quick trims what costs wall time without changing what is measured: one Spark JVM
    # fewer (each takes ~10 s to start on 2 cores) and shorter waits for splits to seal.
    args.workers = args.workers or (2 if quick else 3)
    args.fleet_workers = args.fleet_workers or (2 if quick else 3)
    # Not below 2 s: each split is one Spark job, and on 2 busy cores a job takes ~1 s, so shorter
    # ages pile builds up and the latency phase measures the backlog instead.
    args.max_age = args.max_age or ("2s" if quick else "3s")
    args.driver_memory = args.driver_memory or ("1g" if quick else "2g")
    # A hung phase must fail inside the bench (which then stops what it started), not be
    # killed from outside with servers and workers left behind.
    args.timeout = args.timeout or (150.0 if quick else 1800.0)
    if min(args.records, args.partitions, args.workers, args.repeat, args.fleet_workers) <= 0:
        parser.error("--records, --partitions, --workers, --fleet-workers and --repeat must be positive")
    args.worker_settings = {}
    for item in args.worker_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("INGEST_"):
            parser.error(f"--worker-env: expected INGEST_NAME=VALUE, got {item!r}")
        args.worker_settings[name] = value
    return args
