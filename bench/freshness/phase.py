"""Equal freshness: the highest sustained produce rate each system keeps within a freshness bound.

    python -m bench.freshness [--bound 5] [--interval S] [--probe-seconds 30] [--saturate] [--quick] [--out DIR]
    python -m bench --freshness ...     # the same phase after the throughput runs

For the raw baseline, Quix Streams, Spark Structured Streaming (processing-time trigger) and one
ingest worker: the highest rate at which the p99 of produce-to-visible (bench/freshness/visibility.py, per
record) stays at or under ``--bound`` seconds. Each system reads a topic of its own and keeps
running for the whole phase (bench/freshness/followers.py). Its rate is found by a ramp, then bisection
(bench/freshness/search.py); a probe is one bounded steady phase: produce at the rate for
``--probe-seconds``, wait until every record is visible (bounded), judge. Probes are interleaved,
one per system per round in the order raw, Quix, Spark SS, ingest, so drift of the machine lands
on every system alike. Before the first probe each system runs ``--warmup-seconds`` at the
first probe's rate: a JVM that builds a job every 2.5 s is still compiling its planning code
long after its start (a worker's C2 compiler used 5.7 of its JVM's 19.1 CPU s in a 20 s probe
after 20 s of warm-up, 1.6 of 13.0 after 80 s), and what a probe should see is the long-running
process.

Every system gets the same interval (``--interval``, default half the bound) for what sets its
freshness: the split ``max_age`` of the worker, the trigger of Spark Structured Streaming, the
commit interval of Quix Streams, the flush age of the raw baseline; the other half of the bound
is left for the work itself. The producer runs in this process and shares the cores with the
system probed, as it does for every system.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.console import exit_on_sigterm, log
from bench.data import RecordPool, paced_producer, produce_paced
from bench.freshness.followers import Follower, IngestFollower, QuixFollower, RawFollower, SparkFollower
from bench.freshness.report import ratios, table
from bench.freshness.search import Outcome, RateSearch
from bench.freshness.visibility import Window, read_timestamps_ms, summary
from bench.ingest_runs import Context
from bench.peers import quix
from bench.procs import BusyLoops
from ingest_dev.kafka_clients import create_topic, end_offsets

SYSTEMS = ("raw", "quix", "spark", "ingest")
# Below this share of the asked rate the producer, not the system, was the limit.
PRODUCER_SHORTFALL = 0.95


# Each system's warm-up before its first probe, seconds (the module's docstring says why).
WARMUP_S = 90.0


@dataclass
class FreshnessConfig:
    bound_s: float = 5.0
    interval_s: float = 2.5
    probe_s: float = 30.0
    start_rate: float = 5000.0
    factor: float = 2.0
    tolerance: float = 0.10
    max_probes: int = 10
    warmup_s: float = WARMUP_S
    partitions: int = 6
    # A probe's records must all be visible within this after its produce ended, or the system
    # is given up on (it could not drain, so its next probe would measure a backlog).
    drain_s: float = 300.0
    systems: tuple[str, ...] = SYSTEMS
    quix_python: str | None = None
    peer_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Busy-loop processes (one per CPU with --saturate) spinning through the probes: the
    # systems keep their freshness with other work on the machine.
    busy_loops: int = 0


def _start(key: str, ctx: Context, cfg: FreshnessConfig, run_timeout: float) -> Follower:
    topic = f"fresh-{key}"
    create_topic(ctx.bootstrap, topic, cfg.partitions)
    work = ctx.work / f"fresh-{key}"
    if key == "raw":
        return RawFollower(ctx.bootstrap, topic, work, cfg.interval_s, run_timeout)
    if key == "quix":
        assert cfg.quix_python is not None
        return QuixFollower(cfg.quix_python, ctx.bootstrap, topic, work, cfg.interval_s, run_timeout)
    if key == "spark":
        return SparkFollower(ctx.bootstrap, topic, cfg.partitions, work, cfg.interval_s, run_timeout, ctx.driver_memory)
    return IngestFollower(ctx, topic, work, cfg.interval_s)


def wait_visible(follower: Follower, window: Window, until: float) -> float:
    """Read the follower's new units into ``window`` until all its records are seen or ``until``
    (epoch seconds) passes; returns when the last unit read became visible."""
    last = window.start_ms / 1000
    while True:
        for unit in follower.new_units():
            added = sum(window.add(unit.visible_at, read_timestamps_ms(path)) for path in unit.files)
            if added:
                last = max(last, unit.visible_at)
        if window.seen >= window.produced:
            return last
        follower.check_alive()
        if time.time() > until:
            return last
        time.sleep(0.25)


def probe(follower: Follower, producer: Any, pool: RecordPool, rate: float, cfg: FreshnessConfig) -> dict[str, Any]:
    """One bounded steady phase at ``rate``; its verdict, latencies and CPU."""
    before = follower.sampler.sample()
    paced = produce_paced(producer, follower.topic, cfg.partitions, rate, cfg.probe_s, pool)
    window = Window.of(paced.started_at, paced.ended_at, paced.records)
    visible_at = wait_visible(follower, window, paced.ended_at + cfg.drain_s)
    after = follower.sampler.sample()
    verdict = summary(window, cfg.bound_s)
    if not verdict["passed"]:
        outcome = Outcome.FAILED
    elif paced.rate < PRODUCER_SHORTFALL * rate:
        outcome = Outcome.LIMITED
    else:
        outcome = Outcome.PASSED
    return {
        "rate_asked": rate,
        "rate_produced": paced.rate,
        "seconds": paced.ended_at - paced.started_at,
        **verdict,
        "outcome": outcome.value,
        "drained": verdict["missing"] == 0,
        "last_visible_after_s": visible_at - paced.ended_at,
        # The system's whole process tree, from the first record produced to the last visible.
        "cpu_s_per_million": (after.cpu_s - before.cpu_s) / max(paced.records, 1) * 1e6,
        "rss_mb_at_end": after.rss_bytes / 2**20,
    }


def _warm_up(follower: Follower, producer: Any, pool: RecordPool, cfg: FreshnessConfig, timeout: float) -> None:
    """Start-up and the JIT's first compilations, outside any probe: a low rate until visible."""
    paced = produce_paced(producer, follower.topic, cfg.partitions, cfg.start_rate, cfg.warmup_s, pool)
    window = Window.of(paced.started_at, paced.ended_at, paced.records)
    wait_visible(follower, window, paced.ended_at + timeout)
    if window.seen < window.produced:
        raise RuntimeError(f"{follower.label}: {window.seen} of {window.produced} warm-up records visible")


def _result(follower: Follower | None, search: RateSearch, probes: list[dict[str, Any]]) -> dict[str, Any]:
    best = search.best
    at_best = [p for p in probes if p["rate_asked"] == best]
    return {
        "system": follower.label if follower else None,
        "guarantee": follower.guarantee if follower else None,
        "rate": best,
        "lower_bound": search.limited,
        "p99_s": at_best[-1]["p99_s"] if at_best else None,
        "cpu_s_per_million": at_best[-1]["cpu_s_per_million"] if at_best else None,
        "probes": probes,
    }


def run_freshness(ctx: Context, cfg: FreshnessConfig, run_timeout: float = 4 * 3600.0) -> dict[str, Any]:
    """Every system of ``cfg.systems`` started at once, warmed up, then probed round by round."""
    started = time.time()
    results: dict[str, dict[str, Any]] = {}
    followers: dict[str, Follower] = {}
    searches: dict[str, RateSearch] = {}
    probes: dict[str, list[dict[str, Any]]] = {}
    producer = paced_producer(ctx.bootstrap)
    pool = RecordPool()
    stack = contextlib.ExitStack()
    try:
        for key in cfg.systems:
            if key == "quix" and cfg.quix_python is None:
                results[key] = {"status": "n/a", "reason": cfg.peer_reason or "quixstreams not installed"}
                continue
            followers[key] = _start(key, ctx, cfg, run_timeout)
        for key, follower in list(followers.items()):
            ctx.log(f"[freshness] warming up {follower.label}")
            try:
                _warm_up(follower, producer, pool, cfg, timeout=max(300.0, cfg.drain_s))
            except RuntimeError as e:
                results[key] = {"status": "n/a", "reason": str(e)[-2000:]}
                del followers[key]
                continue
            searches[key] = RateSearch(cfg.start_rate, cfg.factor, cfg.tolerance, cfg.max_probes)
            probes[key] = []
        round_no = 0
        load = stack.enter_context(BusyLoops(cfg.busy_loops, run_timeout))
        if load.n:
            ctx.log(f"[freshness] {load.n} busy-loop process(es) spin through the probes")
        while any(s.next_rate() is not None for s in searches.values()):
            round_no += 1
            for key in [k for k in SYSTEMS if k in searches]:
                rate = searches[key].next_rate()
                if rate is None:
                    continue
                follower = followers[key]
                try:
                    outcome = probe(follower, producer, pool, rate, cfg)
                except RuntimeError as e:
                    results[key] = {"status": "n/a", "reason": str(e)[-2000:], "probes": probes[key]}
                    del searches[key]
                    continue
                outcome["round"] = round_no
                probes[key].append(outcome)
                searches[key].record(rate, Outcome(outcome["outcome"]))
                ctx.log(
                    f"[freshness] round {round_no} {follower.label}: {rate:,.0f}/s -> {outcome['outcome']} "
                    f"(p99 {_s(outcome['p99_s'])}, {outcome['seen']:,}/{outcome['produced']:,} visible)"
                )
                if not outcome["drained"]:
                    results[key] = {"status": "n/a", "reason": f"did not drain {rate:,.0f}/s", "probes": probes[key]}
                    del searches[key]
        for key, search in searches.items():
            results[key] = _result(followers[key], search, probes[key])
    finally:
        stack.close()
        for key, follower in followers.items():
            try:
                ends = end_offsets(ctx.bootstrap, follower.topic)
                final = follower.stop(ends)
            except Exception as e:  # a stop that fails must not keep the others running
                final = {"error": repr(e)}
            results.setdefault(key, {"status": "n/a", "reason": "stopped early"})["final"] = final
    out = {
        "config": {
            "bound_s": cfg.bound_s,
            "interval_s": cfg.interval_s,
            "probe_s": cfg.probe_s,
            "start_rate": cfg.start_rate,
            "factor": cfg.factor,
            "tolerance": cfg.tolerance,
            "max_probes": cfg.max_probes,
            "warmup_s": cfg.warmup_s,
            "partitions": cfg.partitions,
            "order": [k for k in SYSTEMS if k in cfg.systems],
            "busy_loops": cfg.busy_loops,
            **cfg.extra,
        },
        "systems": results,
        "duration_s": time.time() - started,
    }
    out["ratios"] = ratios(out)
    return out


def _s(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f} s"


def freshness_checks(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The exactly-once checks of the systems that promise it, as ``python -m bench`` lists them."""
    checks: dict[str, dict[str, Any]] = {}
    for key, row in results["systems"].items():
        check = row.get("final", {}).get("exactly_once")
        if check is not None:
            checks[f"freshness_{key}"] = check
    return checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The freshness flags, shared by ``python -m bench.freshness`` and ``python -m bench --freshness``."""
    group = parser.add_argument_group("equal freshness")
    group.add_argument("--bound", type=float, default=5.0, help="produce-to-visible p99 bound, seconds (default 5)")
    group.add_argument("--interval", type=float, help="max_age / trigger / commit interval (default bound / 2)")
    group.add_argument("--probe-seconds", type=float, help="steady phase of each probe (default 30; --quick 3)")
    group.add_argument(
        "--warmup-seconds",
        type=float,
        help="each system's warm-up at the first probe's rate before any probe (default 90; --quick 2)",
    )
    group.add_argument("--start-rate", type=float, help="first probe's rate, records/s (default 5000; --quick 500)")
    group.add_argument("--max-probes", type=int, help="probes per system at most (default 10; --quick 1)")
    group.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")


def config_from(args: argparse.Namespace, quick: bool, partitions: int) -> FreshnessConfig:
    systems = tuple(s.strip() for s in str(args.systems).split(",") if s.strip())
    # python -m bench's --skip-spark / --skip-peer leave those systems out here too.
    skipped = {"spark"} if getattr(args, "skip_spark", False) else set()
    skipped |= {"quix"} if getattr(args, "skip_peer", False) else set()
    # Avro records: only the systems set up to read them (bench/avro_wire.py).
    skipped |= {"raw", "quix"} if getattr(args, "format", "json") == "avro" else set()
    systems = tuple(s for s in systems if s not in skipped)
    if not systems:
        raise SystemExit("--systems: every system chosen is skipped (--skip-spark, --skip-peer, --format avro)")
    unknown = set(systems) - set(SYSTEMS)
    if unknown or not systems:
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    interval = args.interval or args.bound / 2
    if args.bound <= 0 or interval <= 0 or interval >= args.bound:
        raise SystemExit("--bound must be positive and --interval below it")
    python, why = (None, "") if "quix" not in systems else quix.find_python(getattr(args, "peer_python", None))
    return FreshnessConfig(
        bound_s=args.bound,
        interval_s=interval,
        probe_s=args.probe_seconds or (3.0 if quick else 30.0),
        start_rate=args.start_rate or (500.0 if quick else 5000.0),
        max_probes=args.max_probes or (1 if quick else 10),
        warmup_s=args.warmup_seconds or (2.0 if quick else WARMUP_S),
        partitions=partitions,
        drain_s=60.0 if quick else 300.0,
        systems=systems,
        quix_python=python,
        peer_reason=why,
        busy_loops=(os.cpu_count() or 1) if getattr(args, "saturate", False) else 0,
    )


def main(argv: list[str] | None = None) -> int:
    from ingest_dev.kafka import LocalKafka
    from ingest_dev.postgres import LocalPostgres
    from metastore import apply_migrations

    parser = argparse.ArgumentParser(prog="python -m bench.freshness", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="CI sizes: one 3 s probe per system at 500/s")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets freshness.json")
    parser.add_argument("--peer-python", help="Python with quixstreams installed (default: the --setup-peer venv)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument(
        "--saturate", action="store_true", help="one busy-loop process per CPU through the probes (cores saturated)"
    )
    add_arguments(parser)
    # SIGTERM unwinds like Ctrl-C: every ``finally`` stops what this started.
    exit_on_sigterm()
    args = parser.parse_args(argv)
    cfg = config_from(args, args.quick, args.partitions)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ingest_freshness_"))
    (work / "logs").mkdir()

    try:
        with LocalPostgres() as pg, LocalKafka(base_dir=work / "broker") as broker:
            apply_migrations(pg.url)
            ctx = Context(pg.url, broker.bootstrap, work, driver_memory=args.driver_memory, log=log)
            results = run_freshness(ctx, cfg)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    (args.out / "freshness.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(table(results))
    checks = freshness_checks(results)
    print("exactly-once checks: " + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in checks.items()))
    return 0 if checks and all(c["ok"] for c in checks.values()) else 1
