"""``python -m bench.fleet``: N thin workers sharing one Spark Connect server beside N workers
with a local Spark each, on one broker and the same data set.

    python -m bench.fleet [--records 1000000] [--partitions 6] [--workers 3] [--modes one,local,connect,...]
                          [--connect-master local[2]] [--rate 2000] [--steady-seconds 30] [--quick]
                          [--out DIR]

Starts a private PostgreSQL and Apache Kafka (127.0.0.1 only). Per mode, a topic of its own gets
the same records (``bench.data``: the same ids, values and partitions), then a fleet of
``--workers`` workers ingests it from a fresh source, then produces at ``--rate`` for
``--steady-seconds`` to the same fleet for produce-to-visible; exactly-once is checked over
everything. The modes:

- ``one``: one worker with ``local[2]`` and two build threads (the one-worker run of ``python -m
  bench``): what the fleets are measured against (the table's last line: thin fleet / one);
- ``local``: each worker runs Spark in its own process (``local[1]``, one build thread), so
  each carries a JVM;
- ``connect``: one Spark Connect server (``--connect-master``, the pyspark wheel's, started
  here) and workers that are thin gRPC clients (``sc://``, one build thread each);
- ``cluster``: a Spark standalone cluster from the pyspark wheel (a master and two workers of a
  core each, ``ingest_dev.spark_cluster``) and one worker whose session is its application
  (``spark://``): the worker's JVM only plans, the cluster's executors read the records;
- ``thin-cluster``: the same cluster, a Spark Connect server that is its application, and
  ``--workers`` thin workers on that server.

Beside records/s: the record bytes the workers' own Kafka clients received (librdkafka's
statistics, ``ingest_kafka_client_received_message_bytes``) against the bytes of the data set,
and each worker's RSS when its first partitions were assigned against its peak: the records go
to Spark, so neither grows with the backlog.

CPU seconds per million records and peak RSS cover whole process trees: the workers and, in
``connect``, the server (its JVM start is before the measured span, its memory is in the peak).
``worker_jvms`` counts the JVMs found under the workers at the end of the bulk phase: 0 is what
a thin worker promises. Prints one table and writes ``DIR/fleet.json``. Numbers mean something
only on an otherwise idle machine: the load average at start and end is recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.console import exit_on_sigterm, log
from bench.data import produce_dataset
from bench.ingest_runs import Context, SplitConfig, run_throughput, steady_latency, verify
from bench.procs import Sample, WorkerProcess, metric, process_tree
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.postgres import LocalPostgres
from ingest_dev.spark_cluster import LocalSparkCluster
from ingest_dev.spark_connect import LocalConnectServer
from metastore import apply_migrations

MODES = ("one", "local", "connect", "cluster", "thin-cluster")
# --quick (the CI smoke test) leaves out the one-worker reference: its run is bench --quick's.
QUICK_MODES = ("local", "thin-cluster")
LABELS = {
    "one": "one worker with local Spark",
    "local": "workers with local Spark",
    "connect": "thin workers, one Spark Connect",
    "cluster": "one worker, standalone cluster",
    "thin-cluster": "thin workers, Connect on the cluster",
}
#: The standalone cluster's workers (each one core): on a 2-core machine, one per core.
CLUSTER_WORKERS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet",
        description="N thin workers on one Spark Connect server beside N workers with local Spark.",
    )
    parser.add_argument("--records", type=int, help="records per mode's topic (default 1,000,000; --quick 20,000)")
    parser.add_argument("--partitions", type=int, help="topic partitions (default 6; --quick 4)")
    parser.add_argument("--workers", type=int, help="workers per fleet (default 3; --quick 2)")
    parser.add_argument(
        "--modes", help=f"which fleets, in order (default {','.join(MODES)}; --quick {','.join(QUICK_MODES)})"
    )
    parser.add_argument(
        "--connect-master", default="local[2]", help="the Connect server's own master (default local[2])"
    )
    parser.add_argument("--driver-memory", help="Spark driver memory: per local worker, and the server's (default 2g)")
    parser.add_argument("--split-records", type=int, default=200_000, help="split max_records (per partition)")
    parser.add_argument("--max-age", help="split max_age (default 3s; --quick 2s)")
    parser.add_argument("--rate", type=float, help="steady produce rate, records/s (default 2000; --quick 500)")
    parser.add_argument("--steady-seconds", type=float, help="steady produce duration (default 30; --quick 5)")
    parser.add_argument("--timeout", type=float, help="bound on each phase, seconds (default 1800; --quick 180)")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets fleet.json")
    args = parser.parse_args(argv)
    quick = args.quick
    args.records = args.records or (20_000 if quick else 1_000_000)
    args.partitions = args.partitions or (4 if quick else 6)
    args.workers = args.workers or (2 if quick else 3)
    args.max_age = args.max_age or ("2s" if quick else "3s")
    args.rate = args.rate or (500.0 if quick else 2000.0)
    args.steady_seconds = args.steady_seconds or (5.0 if quick else 30.0)
    args.driver_memory = args.driver_memory or ("1g" if quick else "2g")
    args.timeout = args.timeout or (180.0 if quick else 1800.0)
    modes = args.modes or ",".join(QUICK_MODES if quick else MODES)
    args.modes = [m.strip() for m in modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if args.records <= 0 or args.partitions <= 0 or args.workers <= 0:
        parser.error("--records, --partitions and --workers must be positive")
    return args


def worker_jvms(pids: list[int]) -> int:
    """JVMs in the process trees of ``pids``."""
    return sum(1 for st in process_tree(pids).values() if st.comm == "java")


def run_mode(ctx: Context, args: argparse.Namespace, mode: str, split: SplitConfig) -> dict[str, Any]:
    """One fleet over its own copy of the data set: bulk, then steady; checked exactly once."""
    topic = f"fleet-{mode}"
    create_topic(ctx.bootstrap, topic, args.partitions)
    data = produce_dataset(ctx.bootstrap, topic, args.records, args.partitions, timeout=max(120.0, args.records / 5000))
    log(f"[{mode}] produced {data.records:,} records to {topic} in {data.seconds:.1f} s")
    server: LocalConnectServer | None = None
    cluster: LocalSparkCluster | None = None
    try:
        roots: list[int] = []
        if mode in ("cluster", "thin-cluster"):
            cluster = LocalSparkCluster(ctx.work / f"cluster-{mode}", workers=CLUSTER_WORKERS, cores=1).start()
            log(f"[{mode}] Spark standalone cluster {cluster.master_url} in {cluster.start_seconds:.1f} s")
            roots += cluster.pids
        if mode in ("connect", "thin-cluster"):
            own_master = cluster.master_url if cluster is not None else args.connect_master
            server = LocalConnectServer(driver_memory=args.driver_memory, master=own_master).start()
            log(f"[{mode}] Spark Connect server {server.url} ({own_master}) in {server.start_seconds:.1f} s")
            assert server.pid is not None
            master = server.url
            roots.append(server.pid)
        elif cluster is not None:
            master = cluster.master_url
        else:
            master = "local[2]" if mode == "one" else "local[1]"
        workers, threads = (1, 2) if mode in ("one", "cluster") else (args.workers, 1)
        result, fleet = run_throughput(ctx, topic, data, workers, master, threads, split, f"fleet_{mode}", roots)
        try:
            result["worker_jvms"] = worker_jvms([w.pid for w in fleet.workers if w.pid is not None])
            received = _received_bytes(fleet.workers)
            steady, ends = steady_latency(
                ctx, fleet, topic, args.partitions, data.ends, args.rate, args.steady_seconds, first_id=args.records
            )
            peaks = fleet.sampler.peak_rss_by_root()
            rss_at_start = _rss_at(fleet.sampler.samples, result["span_start"])
        finally:
            fleet.stop()
        check = verify(ctx, result["source"], topic, ends)
    finally:
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()
    worker_pids = [w.pid or 0 for w in fleet.workers]
    return {
        "mode": mode,
        "spark": _spark_label(mode, args, master),
        **{
            k: result[k]
            for k in (
                "workers",
                "records",
                "wall_s",
                "records_per_s",
                "cpu_s",
                "cpu_s_per_million",
                "worker_process_cpu_s_per_million",
            )
        },
        "peak_rss_mb": result["peak_rss_mb"],
        "peak_rss_mb_per_worker": result["peak_rss_mb_per_worker"],
        "server_peak_rss_mb": sum(peaks.get(pid, 0) for pid in roots) / 2**20,
        "worker_rss_mb_at_start": [rss_at_start.get(pid, 0) / 2**20 for pid in worker_pids],
        "worker_rss_mb_peak": [peaks.get(pid, 0) / 2**20 for pid in worker_pids],
        "worker_kafka_received_bytes": received,
        "value_bytes": data.value_bytes,
        "worker_jvms": result["worker_jvms"],
        "launch_to_done_s": result["launch_to_done_s"],
        "produce_to_visible_s": steady["produce_to_visible_s"],
        "steady": {k: steady[k] for k in ("rate_per_s", "duration_s", "records", "segments")},
        "exactly_once": check,
    }


def _received_bytes(workers: Sequence[WorkerProcess]) -> float | None:
    """The record bytes the workers' own Kafka clients received (librdkafka's statistics);
    None when a worker has not reported them (its statistics not yet emitted)."""
    name = "ingest_kafka_client_received_message_bytes"
    scraped = [w.metrics() for w in workers]
    if not all(any(k.startswith(name + "{") for k in values) for values in scraped):
        return None
    return sum(metric(values, name) for values in scraped)


def _rss_at(samples: Sequence[Sample], at: float) -> dict[int, int]:
    """Each root's RSS in the first sample at or after ``at`` (the last sample if none)."""
    for sample in samples:
        if sample.at >= at:
            return sample.rss_by_root
    return samples[-1].rss_by_root if samples else {}


def _spark_label(mode: str, args: argparse.Namespace, master: str) -> str:
    if mode == "connect":
        return f"one Spark Connect server, {args.connect_master}"
    if mode == "thin-cluster":
        return f"one Spark Connect server on a standalone cluster ({CLUSTER_WORKERS} workers x 1 core)"
    if mode == "cluster":
        return f"standalone cluster ({CLUSTER_WORKERS} workers x 1 core)"
    return master


def run_fleets(
    ctx: Context, args: argparse.Namespace, modes: Sequence[str], split: SplitConfig
) -> list[dict[str, Any]]:
    """Each of ``modes`` in order (``args``: records, partitions, workers, connect_master,
    driver_memory, rate, steady_seconds); ``python -m bench --fleet`` runs the same."""
    return [run_mode(ctx, args, mode, split) for mode in modes]


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "fleet",
        "workers",
        "records/s",
        "CPU s/M",
        "of it workers",
        "peak RSS MB",
        "of it server",
        "JVMs/worker",
        "worker RSS MB start→peak",
        "record bytes in workers",
        "p50 s",
        "p99 s",
    ]
    lines = [head]
    for r in rows:
        lat = r["produce_to_visible_s"]
        starts, peaks = r["worker_rss_mb_at_start"], r["worker_rss_mb_peak"]
        lines.append(
            [
                LABELS[r["mode"]],
                str(r["workers"]),
                f"{r['records_per_s']:,.0f}",
                f"{r['cpu_s_per_million']:.1f}",
                f"{r['worker_process_cpu_s_per_million']:.2f}",
                f"{r['peak_rss_mb']:,.0f}",
                f"{r['server_peak_rss_mb']:,.0f}",
                f"{r['worker_jvms'] / r['workers']:g}",
                f"{max(starts, default=0):,.0f}→{max(peaks, default=0):,.0f}",
                "n/a"
                if r["worker_kafka_received_bytes"] is None
                else f"{r['worker_kafka_received_bytes']:,.0f} of {r['value_bytes']:,.0f}",
                f"{lat.get('p50', 0):.2f}" if lat.get("n") else "n/a",
                f"{lat.get('p99', 0):.2f}" if lat.get("n") else "n/a",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    )
    by_mode = {r["mode"]: r for r in rows}
    if "one" in by_mode and "connect" in by_mode:
        one, thin = by_mode["one"], by_mode["connect"]
        text += (
            f"\nthin fleet / one worker: {thin['records_per_s'] / one['records_per_s']:.2f}x the records/s, "
            f"{thin['peak_rss_mb'] / one['peak_rss_mb']:.2f}x the peak RSS"
        )
        if "local" in by_mode:
            text += f"; {thin['peak_rss_mb'] / by_mode['local']['peak_rss_mb']:.2f}x the local fleet's RSS"
    if "one" in by_mode and "thin-cluster" in by_mode:
        ratio = by_mode["thin-cluster"]["records_per_s"] / by_mode["one"]["records_per_s"]
        text += f"\nthin workers on the cluster / one local worker: {ratio:.2f}x the records/s"
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ingest_bench_fleet_"))
    log(f"working directory {work}")
    split = SplitConfig(max_records=args.split_records, max_age=args.max_age)
    load_start = os.getloadavg()[0]
    started = time.time()
    with LocalPostgres() as pg, LocalKafka(base_dir=work / "broker") as broker:
        log(f"broker: {broker.describe()}")
        apply_migrations(pg.url)
        ctx = Context(pg.url, broker.bootstrap, work, args.driver_memory, args.timeout, log)
        rows = run_fleets(ctx, args, args.modes, split)
    results = {
        "config": {
            "records": args.records,
            "partitions": args.partitions,
            "workers": args.workers,
            "connect_master": args.connect_master,
            "driver_memory": args.driver_memory,
            "max_age": args.max_age,
            "split_records": args.split_records,
            "rate": args.rate,
            "steady_seconds": args.steady_seconds,
            "cpus": os.cpu_count(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg()[0],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "seconds": time.time() - started,
        },
        "fleets": {r["mode"]: r for r in rows},
    }
    (args.out / "fleet.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(table(rows))
    print(f"load average {load_start:.1f} at start, {results['config']['load_average_end']:.1f} at end")
    failed = [r["mode"] for r in rows if not r["exactly_once"]["ok"]]
    for r in rows:
        print(f"exactly once ({r['mode']}): {r['exactly_once']['summary']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
