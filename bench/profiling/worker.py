"""``python -m bench.worker_profile``: where each CPU second of one worker goes, per thread and function.

    python -m bench.worker_profile [--records 1000000] [--partitions 6] [--interval-ms 10] [--top 25] [--out DIR]

One worker (``local[2]``, two build threads, as in ``python -m bench``) ingests a pre-produced
topic under bench/profiling/agent.py. Over the measured span (its first partition assignment to
every partition published) the table gives, in CPU seconds and per million records:

- each Python thread of the worker (the poll loop on ``MainThread``, ``ingest-build-N``,
  ``ingest-publish``, the background thread, ...), with the part of it spent in Python's GC and
  the part inside Py4J's Python code (the calls into the JVM);
- the native threads of the Python process that are not Python threads (librdkafka's): the
  process's CPU minus its Python threads';
- the Spark JVM (the process tree minus the Python process), split by its threads' names:
  executor tasks, the JIT compilers, GC, the rest (Py4J's connection threads among them);
- the Python functions with the most self CPU, each with its thread.

The sampler costs the worker some CPU (its own line in the table, about 1-3 % of a core at
10 ms); nothing else about the worker changes. Numbers mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from bench.console import exit_on_sigterm, log
from bench.data import produce_dataset
from bench.ingest_runs import REPO, Context, Fleet, SplitConfig, apply_source, wait_published, worker_env
from bench.procs import WorkerProcess, parse_log_time, process_tree
from bench.profiling.report import jvm_threads, profile_table, span_profile
from ingest_dev.kafka_clients import create_topic
from ingest_dev.testkit import free_port

TOPIC = "profile"


class ProfiledWorker(WorkerProcess):
    """A bench worker run under the profiling agent (same command line, same settings)."""

    module: ClassVar[str] = "bench.profiling.agent"


def _mark(control: Path, name: str, worker: WorkerProcess, timeout: float = 30.0) -> dict[str, Any]:
    """Ask the agent for a snapshot and read it, with the JVM's per-thread CPU at that moment."""
    assert worker.pid is not None
    (control / f"mark-{name}").touch()
    snap = control / f"snap-{name}.json"
    deadline = time.monotonic() + timeout
    while not snap.exists():
        if time.monotonic() > deadline or worker.poll() is not None:
            raise RuntimeError(f"the profiling agent did not answer {name!r}; worker log:\n{worker.log_tail()}")
        time.sleep(0.05)
    python: dict[str, Any] = json.loads(snap.read_text())
    tree = process_tree([worker.pid])
    python["tree_cpu_s"] = sum(st.cpu_s for st in tree.values())
    python["jvm_threads"] = jvm_threads(tree, worker.pid)
    return python


def _wait_assigned(worker: WorkerProcess, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assigned = [e for e in worker.events("partitions_assigned") if e.get("partitions")]
        if assigned:
            return parse_log_time(assigned[0]["timestamp"])
        if worker.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.poll()}:\n{worker.log_tail()}")
        time.sleep(0.05)
    raise TimeoutError(f"no partition assigned within {timeout:.0f} s")


def run_profile(ctx: Context, records: int, partitions: int, interval_ms: float, split: SplitConfig) -> dict[str, Any]:
    create_topic(ctx.bootstrap, TOPIC, partitions)
    data = produce_dataset(ctx.bootstrap, TOPIC, records, partitions, timeout=max(120.0, records / 5000))
    ctx.log(f"[profile] produced {data.records:,} records over {partitions} partitions")
    source = ctx.new_source("profile")
    apply_source(ctx, source, TOPIC, split)
    control = ctx.work / "profile"
    control.mkdir(parents=True, exist_ok=True)
    env = worker_env(ctx, "local[2]", 2)
    env.update({"BENCH_PROFILE_DIR": str(control), "BENCH_PROFILE_INTERVAL_MS": str(interval_ms)})
    fleet = Fleet(ctx, source, env)
    worker = ProfiledWorker("profile-0", source, env, ctx.work / "logs", free_port(), REPO)
    try:
        worker.start()
        fleet.workers.append(worker)
        # The worker's Spark starts before it joins the group: the span begins at its first
        # assignment, as in python -m bench, so start-up is not in it.
        _wait_assigned(worker, ctx.timeout)
        start = _mark(control, "start", worker)
        wait_published(ctx, fleet, data.ends, TOPIC, ctx.timeout)
        end = _mark(control, "end", worker)
    finally:
        fleet.stop()
    return {
        "records": data.records,
        "partitions": partitions,
        "interval_ms": interval_ms,
        "segments": len(list(worker.events("segment_published"))),
        **span_profile(start, end, data.records),
    }


def main(argv: list[str] | None = None) -> int:
    from ingest_dev.kafka import LocalKafka
    from ingest_dev.postgres import LocalPostgres
    from metastore import apply_migrations

    parser = argparse.ArgumentParser(prog="python -m bench.worker_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--interval-ms", type=float, default=10.0, help="the sampler's period (default 10 ms)")
    parser.add_argument("--top", type=int, default=25, help="Python functions listed (default 25)")
    parser.add_argument("--split-records", type=int, default=200_000)
    parser.add_argument("--max-age", default="3s")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets profile.json")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument(
        "--worker-env", action="append", default=[], metavar="INGEST_NAME=VALUE", help="a worker setting (repeatable)"
    )
    # SIGTERM unwinds like Ctrl-C: every ``finally`` stops what this started.
    exit_on_sigterm()
    args = parser.parse_args(argv)
    settings = dict(item.partition("=")[::2] for item in args.worker_env)
    if any(not name.startswith("INGEST_") or not value for name, value in settings.items()):
        parser.error("--worker-env: expected INGEST_NAME=VALUE")
    if args.records <= 0 or args.partitions <= 0 or args.interval_ms <= 0:
        parser.error("--records, --partitions and --interval-ms must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ingest_profile_"))
    (work / "logs").mkdir()

    split = SplitConfig(max_records=args.split_records, max_age=args.max_age)
    try:
        with LocalPostgres() as pg, LocalKafka(base_dir=work / "broker") as broker:
            apply_migrations(pg.url)
            ctx = Context(pg.url, broker.bootstrap, work, args.driver_memory, args.timeout, log, settings)
            results = run_profile(ctx, args.records, args.partitions, args.interval_ms, split)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    (args.out / "profile.json").write_text(json.dumps(results, indent=2) + "\n")
    print(profile_table(results, args.top))
    return 0
