"""The worker's Python cost per record, by stage and by thread, measured in CPU seconds.

A real worker (``ingest.worker.Worker``, in this process) consumes records pre-produced to the
embedded Kafka broker through its real path: ``ConfluentConsumer.poll`` (librdkafka's messages
to Python objects), the loop's routing (each partition's records gathered, made an Arrow chunk,
taken by its buffer: ``partition_runs``, ``chunks_of``, ``PartitionBuffer.take``), sealing, the
pipeline's build threads (registration in a real PostgreSQL metastore, staging each split as a
Parquet file) and the publish transaction. Spark's job is
replaced by nothing (each split's segment lists its staged file), unless ``--spark``: then the
worker's own ``SparkSegmentBuilder`` runs it, and the JVM's CPU is counted apart.

CPU, not wall time (the machine is shared): each thread's from ``/proc/self/task/<tid>/stat``
(polling thread from the worker's start, build and publish threads, the background thread,
librdkafka's threads), and per stage the thread's own CPU (``time.thread_time``) spent inside
the worker's functions named in ``STAGES``, exclusive of the stages nested in them. Each run
reads the same records with a fresh source (a new consumer group, from earliest); medians over
``--runs``. ``--profile FILE``: one more run with cProfile (timed by each thread's CPU) on the
polling thread and the build threads, their stats merged into FILE (slower, so not in the figures).

    python -m bench.pycost [--records 1000000] [--partitions 6] [--runs 5] [--spark] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import logging
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.data import produce_dataset
from bench.ingest_runs import Context, SplitConfig, apply_source
from bench.procs import process_tree
from ingest.builder import job as builder_module
from ingest.builder.job import BuildResult, SparkSegmentBuilder
from ingest.builder.registration import BuildRegistrar
from ingest.builder.writer_schemas import BatchSchemas
from ingest.config import Settings
from ingest.consume import loop as loop_module
from ingest.consume.kafka import ConfluentConsumer
from ingest.consume.loop import ConsumeLoop
from ingest.consume.rebalance import RebalanceHandler
from ingest.logs import configure_logging
from ingest.publish.publisher import Publisher
from ingest.segments import output_files
from ingest.spec import SourceSpec
from ingest.splits.split import SealedSplit
from ingest.worker import Worker
from ingest_common.model import BuiltSegment
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.postgres import LocalPostgres
from ingest_dev.testkit import wait_until
from metastore import Metastore, apply_migrations

TOPIC = "pycost"
_TICKS = os.sysconf("SC_CLK_TCK")

# (stage name, owner, attribute): the worker's functions whose CPU is counted per stage. A
# stage nested in another (seal inside route, the Arrow table inside staging) is subtracted
# from the outer one, so the stages add up to the time spent in any of them.
STAGES: tuple[tuple[str, Any, str], ...] = (
    ("poll: librdkafka to Python messages", ConfluentConsumer, "poll"),
    ("rebalance callbacks (claims)", RebalanceHandler, "on_assign"),
    ("rebalance callbacks (claims)", RebalanceHandler, "on_revoke"),
    ("route: runs per partition", loop_module, "partition_runs"),
    ("route: messages to Arrow chunks", loop_module, "chunks_of"),
    ("route: buffers (take)", ConsumeLoop, "_route"),
    ("seal", ConsumeLoop, "_seal"),
    ("stage: Arrow table of the chunks", builder_module, "stage_records"),
    ("stage: Parquet write", SparkSegmentBuilder, "_stage"),
    ("spark job: Py4J calls", SparkSegmentBuilder, "_parse"),
    ("output files: footers", output_files, "attribute"),
    ("publish", Publisher, "publish"),
)


class StageMeter:
    """Per-stage CPU of the calling threads (``time.thread_time``), exclusive of nested stages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        with self._lock:
            self.cpu.clear()
            self.calls.clear()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        stack: list[float] = self._local.__dict__.setdefault("children", [])
        stack.append(0.0)
        started = time.thread_time()
        try:
            yield
        finally:
            elapsed = time.thread_time() - started
            nested = stack.pop()
            if stack:
                stack[-1] += elapsed
            with self._lock:
                self.cpu[name] = self.cpu.get(name, 0.0) + elapsed - nested
                self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return function(*args, **kwargs)

        return timed


def install(meter: StageMeter) -> Callable[[], None]:
    """Wrap every stage's function (a static method stays static); returns the undo."""
    undo: list[tuple[Any, str, Any]] = []
    for name, owner, attribute in STAGES:
        raw = owner.__dict__.get(attribute) if isinstance(owner, type) else getattr(owner, attribute, None)
        if raw is None:
            continue
        undo.append((owner, attribute, raw))
        if isinstance(raw, staticmethod):
            setattr(owner, attribute, staticmethod(meter.wrap(name, raw.__func__)))
        else:
            setattr(owner, attribute, meter.wrap(name, raw))

    def restore() -> None:
        for owner, attribute, raw in undo:
            setattr(owner, attribute, raw)

    return restore


class _NoSpark:
    """What ``SparkSegmentBuilder`` asks of a session around a job that is not run."""

    def addTag(self, tag: str) -> None:
        return None

    def removeTag(self, tag: str) -> None:
        return None

    def interruptTag(self, tag: str) -> None:
        return None


class StageOnlyBuilder(SparkSegmentBuilder):
    """The worker's builder with Spark's job replaced by nothing: builds are registered and
    every split staged as the worker does, then each split's segment lists its staged file."""

    def __init__(self, registrar: BuildRegistrar) -> None:
        super().__init__(_NoSpark(), registrar)

    def _run(
        self,
        spark: Any,
        splits: list[SealedSplit],
        spec: SourceSpec,
        fetched: BatchSchemas,
        staged: dict[uuid.UUID, str],
        data_dir: str,
        rejects_dir: str,
    ) -> dict[uuid.UUID, BuildResult]:
        return {
            s.id: BuiltSegment(
                split_id=s.id, location=data_dir, files=(staged[s.id],), row_count=len(s), size_bytes=s.size_bytes
            )
            for s in splits
        }


def _thread_cpu(tid: int) -> float:
    try:
        text = Path(f"/proc/self/task/{tid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _thread_groups(polling: int) -> dict[str, float]:
    """CPU seconds of this process's threads, by what they are."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    groups: dict[str, float] = {}
    for entry in os.scandir("/proc/self/task"):
        tid = int(entry.name)
        name = names.get(tid)
        if tid == polling:
            group = "polling thread"
        elif name is None:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            group = "librdkafka" if comm.startswith("rdk:") else f"native ({comm})"
        elif name.startswith("ingest-build-"):
            group = "build threads"
        elif name == "ingest-publish":
            group = "publish thread"
        elif name.endswith("-background"):
            group = "background thread"
        elif tid == threading.main_thread().native_id:
            continue  # the harness itself
        else:
            group = "other Python threads"
        groups[group] = groups.get(group, 0.0) + _thread_cpu(tid)
    return groups


@dataclass
class RunResult:
    records: int
    wall_s: float
    threads: dict[str, float]
    stages: dict[str, float]
    calls: dict[str, int]
    jvm_s: float = 0.0
    profile: list[cProfile.Profile] = field(default_factory=list)


def _children_cpu_s() -> float:
    me = os.getpid()
    return sum(st.cpu_s for pid, st in process_tree([me]).items() if pid != me)


def run_once(
    ctx: Context,
    ends: dict[int, int],
    meter: StageMeter,
    factory: Callable[[BuildRegistrar], Any],
    *,
    split: SplitConfig,
    profile: bool = False,
) -> RunResult:
    source = ctx.new_source("pycost")
    apply_source(ctx, source, TOPIC, split)
    settings = Settings(
        database_url=ctx.database_url,
        kafka_bootstrap=ctx.bootstrap,
        worker_id=f"pycost-{uuid.uuid4().hex[:6]}",
        warm_up_records=0,
    )
    worker = Worker(settings, source, builder_factory=factory)
    stop = threading.Event()
    failure: list[BaseException] = []
    profiles: list[cProfile.Profile] = []
    started = threading.Event()
    polling_tid: list[int] = []
    restore_profiling: Callable[[], None] = lambda: None  # noqa: E731

    if profile:
        restore_profiling = _profile_builds(profiles)

    def polling() -> None:
        polling_tid.append(threading.get_native_id())
        started.set()
        profiler = cProfile.Profile(time.thread_time) if profile else None
        try:
            if profiler is not None:
                profiler.enable()
            worker.run(stop)
        except BaseException as exc:
            failure.append(exc)
        finally:
            if profiler is not None:
                profiler.disable()
                profiles.append(profiler)

    meter.reset()
    jvm_before = _children_cpu_s()
    thread = threading.Thread(target=polling, name="pycost-polling", daemon=True)
    began = time.monotonic()
    thread.start()
    started.wait()
    try:
        with Metastore(ctx.database_url) as store:

            def done() -> bool:
                if failure:
                    raise RuntimeError(f"worker failed: {failure[0]!r}")
                rows = store.partitions(source)
                return bool(rows) and all(ends.get(r["partition"]) == r["next_offset"] for r in rows)

            wait_until(done, ctx.timeout, f"{source}: every record published", interval=0.1)
        wall = time.monotonic() - began
        threads = _thread_groups(polling_tid[0])
        stages, calls = dict(meter.cpu), dict(meter.calls)
        jvm = _children_cpu_s() - jvm_before
    finally:
        stop.set()
        thread.join(120)
        restore_profiling()
    return RunResult(sum(ends.values()), wall, threads, stages, calls, jvm, profiles)


def _profile_builds(profiles: list[cProfile.Profile]) -> Callable[[], None]:
    """cProfile around every ``build_batch`` call (on the build threads); returns the undo."""
    original = SparkSegmentBuilder.build_batch
    lock = threading.Lock()

    def profiled(self: SparkSegmentBuilder, splits: Any, spec: SourceSpec) -> list[BuildResult]:
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        try:
            return original(self, splits, spec)
        finally:
            profiler.disable()
            with lock:
                profiles.append(profiler)

    SparkSegmentBuilder.build_batch = profiled  # type: ignore[method-assign]

    def restore() -> None:
        SparkSegmentBuilder.build_batch = original  # type: ignore[method-assign]

    return restore


def _per_million(seconds: float, records: int) -> float:
    return seconds * 1_000_000 / records


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """Medians over the runs of CPU s per million records, per thread group and per stage."""
    records = results[0].records
    threads = sorted({k for r in results for k in r.threads})
    stages = list(dict.fromkeys(name for name, _, _ in STAGES if any(name in r.stages for r in results)))

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    python = [sum(v for k, v in r.threads.items()) for r in results]
    return {
        "records": records,
        "runs": len(results),
        "wall_s": median([r.wall_s for r in results]),
        "python_cpu_s_per_million": median([_per_million(p, records) for p in python]),
        "python_cpu_s_per_million_runs": [round(_per_million(p, records), 3) for p in python],
        "threads": {k: median([_per_million(r.threads.get(k, 0.0), records) for r in results]) for k in threads},
        "stages": {k: median([_per_million(r.stages.get(k, 0.0), records) for r in results]) for k in stages},
        "stages_runs": {k: [round(_per_million(r.stages.get(k, 0.0), records), 3) for r in results] for k in stages},
        "calls": {k: max(r.calls.get(k, 0) for r in results) for k in stages},
        "jvm_cpu_s_per_million": median([_per_million(r.jvm_s, records) for r in results]),
    }


def print_summary(summary: dict[str, Any], spark: bool) -> None:
    print(
        f"\n{summary['records']:,} records, {summary['runs']} runs (medians), wall {summary['wall_s']:.1f} s; "
        f"Spark job: {'run' if spark else 'replaced by nothing'}"
    )
    print(f"Python process, all threads: {summary['python_cpu_s_per_million']:.3f} CPU s / M records")
    print(f"  runs: {summary['python_cpu_s_per_million_runs']}")
    print(f"\n{'thread':<40} {'CPU s / M':>10}")
    for name, value in summary["threads"].items():
        print(f"{name:<40} {value:>10.3f}")
    print(f"\n{'stage (thread CPU inside it)':<40} {'CPU s / M':>10} {'calls':>8}")
    for name, value in summary["stages"].items():
        print(f"{name:<40} {value:>10.3f} {summary['calls'][name]:>8}")
    if spark:
        print(f"\nSpark JVM (counted apart): {summary['jvm_cpu_s_per_million']:.3f} CPU s / M records")


def _spark_factory(work: Path) -> tuple[Callable[[BuildRegistrar], Any], Callable[[], None]]:
    from ingest.spark.session import create_session

    spark = create_session("local[2]", "pycost", stores=["file://" + str(work)])

    def factory(registrar: BuildRegistrar) -> Any:
        return SparkSegmentBuilder(spark, registrar)

    return factory, spark.stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pycost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--split-records", type=int, default=SplitConfig.max_records)
    parser.add_argument("--spark", action="store_true", help="run Spark's job too (its JVM counted apart)")
    parser.add_argument("--profile", type=Path, help="one more run under cProfile; its stats to this file")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="write the summary here too")
    args = parser.parse_args(argv)
    configure_logging("json", logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="ingest_pycost_"))
    meter = StageMeter()
    restore = install(meter)
    stop_spark: Callable[[], None] = lambda: None  # noqa: E731
    try:
        with LocalPostgres() as pg, LocalKafka(base_dir=work / "broker") as broker:
            apply_migrations(pg.url)
            create_topic(broker.bootstrap, TOPIC, args.partitions)
            data = produce_dataset(broker.bootstrap, TOPIC, args.records, args.partitions, timeout=600.0)
            print(f"produced {data.records:,} records over {args.partitions} partitions in {data.seconds:.1f} s")
            ctx = Context(database_url=pg.url, bootstrap=broker.bootstrap, work=work, timeout=args.timeout)
            factory: Callable[[BuildRegistrar], Any] = StageOnlyBuilder
            if args.spark:
                factory, stop_spark = _spark_factory(work)
            split = SplitConfig(max_records=args.split_records)
            if args.spark:
                # The first run pays for the JVM's JIT: not counted.
                run_once(ctx, data.ends, meter, factory, split=split)
            results = []
            for n in range(args.runs):
                result = run_once(ctx, data.ends, meter, factory, split=split)
                python = _per_million(sum(result.threads.values()), result.records)
                print(f"run {n + 1}: {python:.3f} Python CPU s / M records, wall {result.wall_s:.1f} s")
                results.append(result)
                shutil.rmtree(work / "segments", ignore_errors=True)
            summary = summarize(results)
            print_summary(summary, args.spark)
            if args.json is not None:
                args.json.write_text(json.dumps(summary, indent=2) + "\n")
            if args.profile is not None:
                profiled = run_once(ctx, data.ends, meter, factory, split=split, profile=True)
                stats = pstats.Stats(profiled.profile[0])
                for extra in profiled.profile[1:]:
                    stats.add(extra)
                stats.dump_stats(str(args.profile))
                stats.sort_stats("tottime").print_stats(25)
    finally:
        stop_spark()
        restore()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
