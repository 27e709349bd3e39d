"""``python -m bench``: ingest vs. a raw ceiling vs. a peer, on one broker and one pre-produced data set.

    python -m bench [--records 1000000] [--partitions 6] [--workers 3] [--skip-peer] [--skip-spark]
                    [--saturate] [--quick] [--freshness] [--profile] [--format json|avro] [--out DIR]
    python -m bench --setup-peer        # create the Quix Streams peer's own virtualenv

Starts a private PostgreSQL and Apache Kafka (one KRaft node, 127.0.0.1 only), produces the data once, then
runs each system against it with a fresh consumer group / source.  Prints one table, writes
``DIR/results.json`` and ``DIR/chart.png``.  Numbers are only meaningful on an otherwise idle
machine: the load average at start and end is recorded next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import avro_wire as avro
from bench import freshness, freshness_report, peer, report, streaming_peer, worker_profile
from bench.data import Produced, produce_dataset, produce_steady
from bench.ingest_runs import REPO, Context, Fleet, SplitConfig, run_throughput, steady_latency, verify
from bench.profile_report import profile_table
from bench.rebalances import run_rebalance
from bench.stats import percentiles
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.postgres import LocalPostgres
from ingest_dev.registry import LocalSchemaRegistry
from metastore import apply_migrations

TOPIC = "bench"
JSON_ONLY = "--format avro: this system is set up for the JSON records only"
REBALANCE_TOPIC = "bench-rebalance"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
    parser.add_argument("--skip-rebalance", action="store_true")
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
    parser.add_argument(
        "--rebalance-records", type=int, help="records on the rebalance topic (default min(records, 100000))"
    )
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
        "--scaling",
        action="store_true",
        help="also ingest the data set with each of --scaling-workers, and with one worker over "
        "topics of each of --scaling-partitions partitions",
    )
    parser.add_argument("--scaling-workers", default="1,2,3", help="worker counts of --scaling (default 1,2,3)")
    parser.add_argument("--scaling-partitions", default="2,6,12", help="partition counts of --scaling (default 2,6,12)")
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
        help="also the equal-freshness phase (bench/freshness.py); it replaces the Spark peer's "
        "own produce-to-visible phase, which it measures per record at several rates",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one worker over a topic of --records records, per thread and Python function "
        "(bench/worker_profile.py; alone: python -m bench.worker_profile)",
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
    # Not below 2 s: each split is one Spark job, and on 2 busy cores a job takes ~1 s, so shorter
    # ages pile builds up and the latency phase measures the backlog instead.
    args.max_age = args.max_age or ("2s" if quick else "3s")
    args.rebalance_records = args.rebalance_records or min(args.records, 100_000)
    args.driver_memory = args.driver_memory or ("1g" if quick else "2g")
    # A hung phase must fail inside the bench (which then stops what it started), not be
    # killed from outside with servers and workers left behind.
    args.timeout = args.timeout or (150.0 if quick else 1800.0)
    if args.records <= 0 or args.partitions <= 0 or args.workers <= 0 or args.repeat <= 0:
        parser.error("--records, --partitions, --workers and --repeat must be positive")
    args.worker_settings = {}
    for item in args.worker_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("INGEST_"):
            parser.error(f"--worker-env: expected INGEST_NAME=VALUE, got {item!r}")
        args.worker_settings[name] = value
    for name in ("scaling_workers", "scaling_partitions"):
        try:
            counts = [int(x) for x in getattr(args, name).split(",") if x.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) <= 0:
            parser.error(f"--{name.replace('_', '-')}: a comma-separated list of positive integers")
        setattr(args, name, counts)
    return args


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median records/s (the lower one of an even count), annotated with every
    run's records/s. A run that could not be measured ("n/a") makes the whole result n/a."""
    failed = [r for r in runs if r.get("status") == "n/a"]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: float(r["records_per_s"]))
    median = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        median["runs_records_per_s"] = [r["records_per_s"] for r in runs]
    return median


def _scaling_row(result: dict[str, Any], check: dict[str, Any], **key: int) -> dict[str, Any]:
    return {
        **key,
        **{
            k: result[k]
            for k in ("records_per_s", "mb_per_s", "cpu_s_per_million", "wall_s", "peak_rss_mb", "segments")
        },
        "exactly_once": check["ok"],
    }


def _scaling_topic(ctx: Context, args: argparse.Namespace, partitions: int, name: str) -> Produced:
    """A fresh topic with the data set (the main topic has the latency phase's records too)."""
    create_topic(ctx.bootstrap, name, partitions)
    return produce_dataset(ctx.bootstrap, name, args.records, partitions, timeout=max(120.0, args.records / 5000))


def run_scaling(
    ctx: Context, args: argparse.Namespace, split: SplitConfig, checks: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Throughput by worker count (one topic) and by partition count (one worker). A worker
    alone gets ``local[2]`` and two build threads; several share the cores with ``local[1]``
    and one each, as in the main runs."""
    by_workers: list[dict[str, Any]] = []
    topic = f"{TOPIC}-workers"
    data = _scaling_topic(ctx, args, args.partitions, topic)
    for n in args.scaling_workers:
        master, threads = ("local[2]", 2) if n == 1 else ("local[1]", 1)
        result, fleet = run_throughput(ctx, topic, data, n, master, threads, split, f"scale_w{n}")
        fleet.stop()
        check = checks[f"scale_w{n}"] = verify(ctx, result["source"], topic, data.ends)
        by_workers.append(_scaling_row(result, check, workers=n))
    by_partitions: list[dict[str, Any]] = []
    for parts in args.scaling_partitions:
        topic = f"{TOPIC}-p{parts}"
        produced = _scaling_topic(ctx, args, parts, topic)
        result, fleet = run_throughput(ctx, topic, produced, 1, "local[2]", 2, split, f"scale_p{parts}")
        fleet.stop()
        check = checks[f"scale_p{parts}"] = verify(ctx, result["source"], topic, produced.ends)
        by_partitions.append(_scaling_row(result, check, partitions=parts))
    return {"workers": by_workers, "partitions": by_partitions}


def run_raw(
    ctx: Context, data_ends: dict[int, int], records: int, value_bytes: int, batch: int, timeout: float, run: int = 1
) -> dict[str, Any]:
    """The raw baseline in its own process (its CPU and memory are its own); each run writes
    into its own directory."""
    result_path = ctx.work / f"raw-result-{run}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    with (ctx.work / "logs" / f"raw-{run}.log").open("wb") as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.raw",
                "--bootstrap",
                ctx.bootstrap,
                "--topic",
                TOPIC,
                "--ends",
                json.dumps(data_ends),
                "--out",
                str(ctx.work / f"raw-{run}"),
                "--batch",
                str(batch),
                "--timeout",
                str(timeout),
                "--result",
                str(result_path),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout + 60,
            check=False,
        )
    if proc.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"raw baseline failed ({proc.returncode}): see {ctx.work / 'logs' / f'raw-{run}.log'}")
    raw: dict[str, Any] = json.loads(result_path.read_text())
    wall = max(raw["last_write_at"] - raw["first_record_at"], 1e-6)
    return {
        "system": "raw",
        "records": records,
        "rows_written": raw["rows"],
        "value_bytes": value_bytes,
        "wall_s": wall,
        "records_per_s": records / wall,
        "mb_per_s": value_bytes / wall / 1e6,
        "cpu_s": raw["cpu_s"],
        "cpu_s_per_million": raw["cpu_s"] / records * 1e6,
        "peak_rss_mb": raw["peak_rss_mb"],
        "files": raw["files"],
        "file_bytes": raw["file_bytes"],
    }


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in ("confluent-kafka", "pyspark", "pyarrow", "psycopg"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def _publish_samples(fleets: list[Fleet]) -> list[float]:
    return [float(e["publish_ms"]) for f in fleets for e in f.events("segment_published") if "publish_ms" in e]


class BusyLoops:
    """``n`` processes spinning on a CPU each, for at most ``limit_s`` seconds (they end by
    themselves even if the bench dies), while the block runs."""

    def __init__(self, n: int, limit_s: float) -> None:
        self.n = n
        self.limit_s = limit_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        code = f"import time\nend = time.monotonic() + {self.limit_s}\nwhile time.monotonic() < end: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


def _load(args: argparse.Namespace) -> BusyLoops:
    n = (os.cpu_count() or 1) if args.saturate else 0
    # Bound: the steady phase, plus the wait for its last split and a Spark session start.
    return BusyLoops(n, args.steady_seconds + 180)


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM's default kills at once; as SystemExit it unwinds through every ``finally`` below,
    # which stops the workers, the broker and PostgreSQL.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if args.setup_peer:
        print(f"peer virtualenv ready: {peer.setup_venv()}")
        return 0
    # Checked before anything starts: a bad flag fails at once, not after the throughput phases.
    fresh_cfg = freshness.config_from(args, args.quick, args.partitions) if args.freshness else None
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    split = SplitConfig(max_records=args.split_records, max_age=args.max_age)
    from ingest.spec import parse_duration

    max_age_s = parse_duration("--max-age", args.max_age)
    work = Path(tempfile.mkdtemp(prefix="ingest_bench_"))
    (work / "logs").mkdir()
    log(f"working directory {work}")
    load_start = os.getloadavg()[0]
    results: dict[str, Any] = {}
    throughput: dict[str, dict[str, Any]] = {}
    checks: dict[str, dict[str, Any]] = {}
    fleets: list[Fleet] = []
    try:
        with LocalPostgres() as pg, LocalKafka(base_dir=work / "broker") as broker, contextlib.ExitStack() as stack:
            log(f"broker: {broker.describe()}, started in {broker.started_in_s:.1f} s")
            results["broker"] = broker.describe()
            if args.format == "avro":
                registry = stack.enter_context(LocalSchemaRegistry(base_dir=work / "registry"))
                wire = avro.activate(registry.url)
                results["registry"] = registry.describe()
                log(f"records in Avro (Confluent wire format, schema id {wire.schema_id}): {registry.describe()}")
            ctx = Context(
                database_url=pg.url,
                bootstrap=broker.bootstrap,
                work=work,
                driver_memory=args.driver_memory,
                timeout=args.timeout,
                log=log,
                worker_settings=args.worker_settings,
            )
            apply_migrations(pg.url)
            create_topic(broker.bootstrap, TOPIC, args.partitions)
            data = produce_dataset(
                broker.bootstrap, TOPIC, args.records, args.partitions, timeout=max(120.0, args.records / 5000)
            )
            log(
                f"produced {data.records:,} records ({data.avg_value_bytes:.0f} B avg) over {args.partitions} "
                f"partitions in {data.seconds:.1f} s"
            )

            if args.format == "avro":
                throughput["raw"] = {"status": "n/a", "reason": JSON_ONLY}
            else:
                log("[raw] confluent-kafka + pyarrow.json + Parquet")
                throughput["raw"] = median_run(
                    [
                        run_raw(ctx, data.ends, data.records, data.value_bytes, args.split_records, args.timeout, run)
                        for run in range(1, args.repeat + 1)
                    ]
                )

            if args.skip_peer or args.format == "avro":
                why = "skipped (--skip-peer)" if args.skip_peer else JSON_ONLY
                throughput["peer"] = {"status": "n/a", "reason": why}
            else:
                peer_python, why = peer.find_python(args.peer_python)
                if peer_python is None:
                    throughput["peer"] = {"status": "n/a", "reason": why}
                    log(f"[peer] n/a: {why}")
                else:
                    log(f"[peer] quixstreams under {peer_python}")
                    peer_runs: list[dict[str, Any]] = []
                    for run in range(1, args.repeat + 1):
                        try:
                            peer_runs.append(
                                peer.run(
                                    peer_python,
                                    broker.bootstrap,
                                    TOPIC,
                                    data.records,
                                    data.value_bytes,
                                    work / f"peer-{run}",
                                    commit_interval=max_age_s,
                                    timeout=args.timeout,
                                )
                            )
                        except subprocess.TimeoutExpired:
                            peer_runs.append({"status": "n/a", "reason": f"no result within {args.timeout:.0f} s"})
                            break
                    throughput["peer"] = median_run(peer_runs)

            spark_ran = False
            if args.skip_spark:
                throughput["spark"] = {"status": "n/a", "reason": "skipped (--skip-spark)"}
            else:
                try:
                    streaming_peer.fetch_jars()
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    why = f"could not fetch Spark's Kafka source (scripts/setup.sh fetches it): {e}"
                    throughput["spark"] = {"status": "n/a", "reason": why}
                    log(f"[spark] n/a: {why}")
                else:
                    spark_ran = True
                    log("[spark] structured streaming, availableNow, local[2]")
                    throughput["spark"] = median_run(
                        [
                            streaming_peer.run_throughput(
                                broker.bootstrap,
                                TOPIC,
                                data.ends,
                                data.records,
                                data.value_bytes,
                                work / f"spark-{run}",
                                args.timeout,
                                args.driver_memory,
                            )
                            for run in range(1, args.repeat + 1)
                        ]
                    )
                    spark_row = throughput["spark"]
                    if spark_row.get("status") != "n/a":
                        checks["spark"] = {
                            "ok": spark_row["exactly_once"],
                            "summary": f"{spark_row['rows_written']} rows committed for {data.records} produced",
                        }

            ones: list[dict[str, Any]] = []
            for i in range(args.repeat):
                label = "ingest_1" if args.repeat == 1 else f"ingest_1_run{i + 1}"
                one, fleet1 = run_throughput(ctx, TOPIC, data, 1, "local[2]", 2, split, label)
                fleets.append(fleet1)
                ones.append(one)
                if i < args.repeat - 1:
                    # Every run is checked; the last one's fleet goes on to the latency phase.
                    fleet1.stop()
                    checks[f"ingest_1_run{i + 1}"] = verify(ctx, one["source"], TOPIC, data.ends)
            # Produce-to-visible on one worker (local[2]: the peer's deployment, one process and one
            # JVM), then on the N-worker fleet (N JVMs sharing the cores).
            with _load(args):
                steady, ends = steady_latency(
                    ctx,
                    fleet1,
                    TOPIC,
                    args.partitions,
                    data.ends,
                    args.rate,
                    args.steady_seconds,
                    first_id=args.records,
                )
            steady_n: dict[str, Any] | None = None
            fleet1.stop()
            checks["ingest_1"] = verify(ctx, one["source"], TOPIC, ends)
            throughput["ingest_1"] = median_run(ones)
            if args.workers > 1:
                n, fleet_n = run_throughput(ctx, TOPIC, data, args.workers, "local[1]", 1, split, "ingest_n")
                fleets.append(fleet_n)
                try:
                    with _load(args):
                        # Its bulk phase also read the first steady phase's records: only the
                        # segments after them are this fleet's steady ones.
                        steady_n, ends_n = steady_latency(
                            ctx,
                            fleet_n,
                            TOPIC,
                            args.partitions,
                            ends,
                            args.rate,
                            args.steady_seconds,
                            first_id=args.records + steady["records"],
                        )
                finally:
                    fleet_n.stop()
                checks["ingest_n"] = verify(ctx, n["source"], TOPIC, ends_n)
                throughput["ingest_n"] = n
                ends = ends_n

            spark_latency: dict[str, Any] | None = None
            if spark_ran and throughput["spark"].get("status") != "n/a" and not args.freshness:
                log(f"[spark] produce-to-visible, processingTime {max_age_s:g} s")
                latency_ends = dict(ends)

                def produce_for_spark() -> int:
                    produced = produce_steady(
                        broker.bootstrap,
                        TOPIC,
                        args.partitions,
                        args.rate,
                        args.steady_seconds,
                        first_id=args.records + 10_000_000,
                    )
                    return produced.records

                with _load(args):
                    spark_latency = streaming_peer.run_latency(
                        broker.bootstrap,
                        TOPIC,
                        latency_ends,
                        work / "spark-latency",
                        args.timeout,
                        args.driver_memory,
                        max_age_s,
                        produce_for_spark,
                    )
                if spark_latency.get("status") == "n/a":
                    log(f"[spark] produce-to-visible n/a: {spark_latency['reason']}")
                else:
                    checks["spark_latency"] = {
                        "ok": spark_latency["exactly_once"],
                        "summary": f"{spark_latency['records']} steady records committed exactly once",
                    }

            publish = _publish_samples(fleets)
            results["latency"] = {
                "publish_transaction_ms": percentiles(publish),
                "publish_ms_samples": sorted(publish),
                "produce_to_visible_s": steady["produce_to_visible_s"],
                "steady": {**steady, "workers": 1},
                "saturated": (os.cpu_count() or 1) if args.saturate else 0,
            }
            if steady_n is not None:
                results["latency"]["steady_n"] = {**steady_n, "workers": args.workers}
            if spark_latency is not None:
                results["latency"]["spark"] = spark_latency
            if not args.skip_rebalance:
                results["rebalance"] = run_rebalance(ctx, REBALANCE_TOPIC, args.rebalance_records, "local[1]")
                checks["rebalance"] = results["rebalance"]["exactly_once"]
            if args.scaling:
                ctx.log("[scaling] by workers, then by partitions")
                results["scaling"] = run_scaling(ctx, args, split, checks)
            if fresh_cfg is not None:
                ctx.log("[freshness] raw, Quix, Spark SS, ingest: ramp, then bisection")
                results["freshness"] = freshness.run_freshness(ctx, fresh_cfg)
                checks.update(freshness.freshness_checks(results["freshness"]))
            if args.profile:
                ctx.log("[profile] one worker under the profiling agent")
                results["profile"] = worker_profile.run_profile(ctx, args.records, args.partitions, 10.0, split)
    finally:
        for f in fleets:
            f.stop()  # no-op for fleets already stopped
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    for row in throughput.values():
        # The samples live under "latency"; keep the per-run rows flat.
        row.pop("publish_ms", None)
        row.pop("build_s", None)
    results = {
        "config": {
            "records": args.records,
            "partitions": args.partitions,
            "workers": args.workers,
            "repeat": args.repeat,
            "avg_record_bytes": data.avg_value_bytes,
            "value_bytes": data.value_bytes,
            "split": {"max_records": split.max_records, "max_bytes": split.max_bytes, "max_age": split.max_age},
            "peer_commit_interval_s": max_age_s,
            "spark_peer": {
                "pyspark": _versions()["pyspark"],
                "connector": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{streaming_peer.connector_version()}",
                "master": "local[2]",
            },
            "saturate": args.saturate,
            "steady_rate_per_s": args.rate,
            "steady_seconds": args.steady_seconds,
            "rebalance_records": args.rebalance_records,
            "driver_memory": args.driver_memory,
            "worker_settings": args.worker_settings,
            "quick": args.quick,
            "format": args.format,
            "cpus": os.cpu_count(),
            "load_at_start": load_start,
            "load_at_end": os.getloadavg()[0],
            "python": platform.python_version(),
            "versions": _versions(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": time.time() - started,
            "mb": "10^6 bytes of record values (keys and Kafka overhead not counted)",
            "measured_span": "first record handed to the system -> last output published / written",
        },
        "throughput": throughput,
        "ratios": report.ratios(throughput),
        **results,
        "exactly_once": checks,
    }
    report.write_json(results, args.out / "results.json")
    no_chart = report.chart(results, args.out / "chart.png")
    print(report.table(results))
    if "freshness" in results:
        print("\n" + freshness_report.table(results["freshness"]))
    if "profile" in results:
        print("\n" + profile_table(results["profile"]))
    print(
        f"\nresults: {args.out / 'results.json'}"
        + (f"; {no_chart}" if no_chart else f", chart: {args.out / 'chart.png'}")
    )
    return 0 if all(c["ok"] for c in checks.values()) else 1
