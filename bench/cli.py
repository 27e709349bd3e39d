"""``python -m bench``: ingest vs. a raw ceiling vs. a peer, on one broker and one pre-produced data set.

    python -m bench [--records 1000000] [--partitions 6] [--workers 3] [--skip-peer] [--skip-spark]
                    [--saturate] [--quick] [--freshness] [--profile] [--fleet] [--format json|avro]
                    [--out DIR]
    python -m bench --setup-peer        # create the Quix Streams peer's own virtualenv

Starts a private PostgreSQL and Apache Kafka (one KRaft node, 127.0.0.1 only), produces the data once, then
runs each system against it with a fresh consumer group / source.  Prints one table, writes
``DIR/results.json`` and ``DIR/chart.png``.  Numbers are only meaningful on an otherwise idle
machine: the load average at start and end is recorded next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import avro_wire as avro
from bench import fleet, report
from bench.console import exit_on_sigterm, log
from bench.data import TOPIC, produce_dataset, produce_steady
from bench.freshness import phase as freshness
from bench.freshness import report as freshness_report
from bench.ingest_runs import Context, Fleet, SplitConfig, run_throughput, steady_latency, verify
from bench.options import parse_args
from bench.peers import quix, spark
from bench.peers.raw_run import run_raw
from bench.procs import BusyLoops
from bench.profiling import worker as worker_profile
from bench.profiling.report import profile_table
from bench.stats import median_run, percentiles
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.postgres import LocalPostgres
from ingest_dev.registry import LocalSchemaRegistry
from metastore import apply_migrations

JSON_ONLY = "--format avro: this system is set up for the JSON records only"


#: What scripts/test sets to run test JVMs on C1 only; a benchmark under them says so.
JVM_OPTION_VARS = ("SPARK_SUBMIT_OPTS", "INGEST_DEV_JAVA_OPTIONS")


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


def _load(args: argparse.Namespace) -> BusyLoops:
    n = (os.cpu_count() or 1) if args.saturate else 0
    # Bound: the steady phase, plus the wait for its last split and a Spark session start.
    return BusyLoops(n, args.steady_seconds + 180)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    if args.setup_peer:
        print(f"peer virtualenv ready: {quix.setup_venv()}")
        return 0
    # Checked before anything starts: a bad flag fails at once, not after the throughput phases.
    fresh_cfg = freshness.config_from(args, args.quick, args.partitions) if args.freshness else None
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    split = SplitConfig(max_records=args.split_records, max_age=args.max_age)
    from ingest.spec.parse import parse_duration

    max_age_s = parse_duration("--max-age", args.max_age)
    work = Path(tempfile.mkdtemp(prefix="ingest_bench_"))
    (work / "logs").mkdir()
    log(f"working directory {work}")
    jvm_env = {k: os.environ[k] for k in JVM_OPTION_VARS if os.environ.get(k)}
    if jvm_env:
        log(f"JVM options from the environment {jvm_env}: figures are not comparable with docs/benchmarks.md")
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
                peer_python, why = quix.find_python(args.peer_python)
                if peer_python is None:
                    throughput["peer"] = {"status": "n/a", "reason": why}
                    log(f"[peer] n/a: {why}")
                else:
                    log(f"[peer] quixstreams under {peer_python}")
                    peer_runs: list[dict[str, Any]] = []
                    for run in range(1, args.repeat + 1):
                        try:
                            peer_runs.append(
                                quix.run(
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
                    spark.fetch_jars()
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    why = f"could not fetch Spark's Kafka source (scripts/setup.sh fetches it): {e}"
                    throughput["spark"] = {"status": "n/a", "reason": why}
                    log(f"[spark] n/a: {why}")
                else:
                    spark_ran = True
                    log("[spark] structured streaming, availableNow, local[2]")
                    throughput["spark"] = median_run(
                        [
                            spark.run_throughput(
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
                    spark_latency = spark.run_latency(
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
            if fresh_cfg is not None:
                ctx.log("[freshness] raw, Quix, Spark SS, ingest: ramp, then bisection")
                results["freshness"] = freshness.run_freshness(ctx, fresh_cfg)
                checks.update(freshness.freshness_checks(results["freshness"]))
            if args.profile:
                ctx.log("[profile] one worker under the profiling agent")
                results["profile"] = worker_profile.run_profile(ctx, args.records, args.partitions, 10.0, split)
            if args.fleet:
                modes = fleet.QUICK_MODES if args.quick else fleet.MODES
                ctx.log(f"[fleet] {', '.join(fleet.LABELS[m] for m in modes)}")
                fleet_args = argparse.Namespace(**{**vars(args), "workers": args.fleet_workers})
                rows = fleet.run_fleets(ctx, fleet_args, modes, split)
                results["fleet"] = {r["mode"]: r for r in rows}
                checks.update({f"fleet_{r['mode']}": r["exactly_once"] for r in rows})
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
                "connector": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.connector_version()}",
                "master": "local[2]",
            },
            "saturate": args.saturate,
            "steady_rate_per_s": args.rate,
            "steady_seconds": args.steady_seconds,
            "driver_memory": args.driver_memory,
            "worker_settings": args.worker_settings,
            "quick": args.quick,
            "format": args.format,
            "jvm_options_env": jvm_env,
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
    if "fleet" in results:
        print("\n" + fleet.table(list(results["fleet"].values())))
    print(
        f"\nresults: {args.out / 'results.json'}"
        + (f"; {no_chart}" if no_chart else f", chart: {args.out / 'chart.png'}")
    )
    return 0 if all(c["ok"] for c in checks.values()) else 1
