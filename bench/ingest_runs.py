"""The ingest side of the bench: worker fleets, their throughput and latency.

Every run gets a new source (so a new consumer group and no stored offsets: it starts from
earliest) and its own segment store directory.  Completion is read from the metastore:
every partition's ``next_offset`` equals Kafka's log end offset (``bench.data.kafka_ends``,
which checks it against the producer's delivery reports).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from bench import avro_wire as avro
from bench.data import EVENT_TIME, SCHEMA, Produced, produce_steady
from bench.procs import TreeSampler, WorkerProcess, parse_log_time
from bench.stats import percentiles
from ingest.spec.parse import spec_from_dict
from ingest_dev.ingest_process import stop_all
from ingest_dev.testkit import free_port
from ingest_dev.verify import verify_exactly_once
from metastore import Metastore

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SplitConfig:
    max_records: int = 200_000
    max_bytes: str = "64MiB"
    max_age: str = "3s"


@dataclass
class Context:
    database_url: str
    bootstrap: str
    work: Path
    driver_memory: str = "2g"
    timeout: float = 900.0
    log: Callable[[str], None] = print
    # INGEST_* settings given with --worker-env, applied over the bench's own.
    worker_settings: dict[str, str] = field(default_factory=dict)

    def new_source(self, prefix: str) -> str:
        # Source names: a-z first, then a-z 0-9 _ - ; a new name = a new group, offsets from earliest.
        return f"{prefix}_{uuid.uuid4().hex[:6]}"


def apply_source(
    ctx: Context, source: str, topic: str, split: SplitConfig, spec_extra: Mapping[str, Any] | None = None
) -> None:
    """The bench's source over ``topic``; ``spec_extra``: more spec keys (an upsert table's, say)."""
    store_dir = ctx.work / "segments" / source
    store_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "name": source,
        "topics": [topic],
        "start_from": "earliest",
        "event_time": EVENT_TIME,
        "segment_store": "file://" + str(store_dir),
        "on_parse_error": "reject",
        "schema": dict(SCHEMA),
        "split": {"max_records": split.max_records, "max_bytes": split.max_bytes, "max_age": split.max_age},
        **(spec_extra or {}),
    }
    wire = avro.active()
    if wire is not None:
        # The records are Avro behind the registry; the spec's [schema] is the reader schema.
        doc.update({"format": "avro", "registry": {"url": wire.registry_url}})
    spec = spec_from_dict(doc)
    text = "# written by python -m bench\n" + "\n".join(f"{k} = {v!r}" for k, v in doc.items())
    with Metastore(ctx.database_url) as store:
        store.apply_source(spec.name, spec.to_json(), text)


def worker_env(ctx: Context, spark_master: str, build_threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env.update(
        {
            "INGEST_DATABASE_URL": ctx.database_url,
            "INGEST_KAFKA_BOOTSTRAP": ctx.bootstrap,
            "INGEST_SPARK_MASTER": spark_master,
            "INGEST_SPARK_DRIVER_MEMORY": ctx.driver_memory,
            "INGEST_BUILD_THREADS": str(build_threads),
            "INGEST_LOG_FORMAT": "json",
            # As in the demo and the process tests: group changes settle in seconds, not ~25 s.
            "INGEST_KAFKA_PROP_SESSION_TIMEOUT_MS": "6000",
            "INGEST_KAFKA_PROP_HEARTBEAT_INTERVAL_MS": "500",
            # librdkafka's statistics each second: the record bytes the worker's own clients
            # received (ingest_kafka_client_received_message_bytes), which bench.fleet reports.
            "INGEST_KAFKA_PROP_STATISTICS_INTERVAL_MS": "1000",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        }
    )
    if avro.active() is not None:
        env["SPARK_CONF_DIR"] = str(_avro_spark_conf(ctx.work))
    env.update(ctx.worker_settings)
    return env


def _avro_spark_conf(work: Path) -> Path:
    """A SPARK_CONF_DIR whose spark-defaults.conf loads the project's pinned jars, spark-avro
    among them: a local worker's session loads them by itself only for s3a:// stores, and
    otherwise takes jars from there (ingest.spark.session.session_conf), as an operator sets them."""
    from ingest.spark.jars import spark_jars

    conf = work / "spark-conf"
    conf.mkdir(parents=True, exist_ok=True)
    jars = ",".join(str(j) for j in spark_jars())
    (conf / "spark-defaults.conf").write_text(f"spark.jars {jars}\n")
    return conf


@dataclass
class Fleet:
    ctx: Context
    source: str
    env: dict[str, str]
    sampler: TreeSampler = field(default_factory=TreeSampler)
    workers: list[WorkerProcess] = field(default_factory=list)

    def add(self, name: str) -> WorkerProcess:
        worker = WorkerProcess(name, self.source, self.env, self.ctx.work / "logs", free_port(), REPO).start()
        self.workers.append(worker)
        assert worker.pid is not None
        self.sampler.add_root(worker.pid)
        return worker

    def check_alive(self) -> None:
        dead = [w for w in self.workers if w.poll() not in (0, None)]
        if dead:
            w = dead[0]
            raise RuntimeError(f"worker {w.name} exited with {w.poll()}; log tail:\n{w.log_tail()}")

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for w in self.workers for e in w.events(name)]

    def stop(self) -> None:
        try:
            stop_all(self.workers)
        finally:
            self.sampler.stop()


def start_fleet(
    ctx: Context,
    source: str,
    n: int,
    spark_master: str,
    build_threads: int,
    prefix: str,
    extra_roots: Sequence[int] = (),
) -> Fleet:
    """``extra_roots``: other processes the fleet's figures include (a shared Spark Connect
    server), sampled from the start like the workers."""
    (ctx.work / "logs").mkdir(parents=True, exist_ok=True)
    fleet = Fleet(ctx, source, worker_env(ctx, spark_master, build_threads))
    for pid in extra_roots:
        fleet.sampler.add_root(pid)
    fleet.sampler.start()
    for i in range(n):
        fleet.add(f"{prefix}-{i}")
    return fleet


def wait_published(ctx: Context, fleet: Fleet, ends: dict[int, int], topic: str, timeout: float) -> None:
    """Until every partition's stored next_offset equals its log end (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    with Metastore(ctx.database_url) as store:
        while True:
            positions = {(r["topic"], r["partition"]): r["next_offset"] for r in store.partitions(fleet.source)}
            if all((positions.get((topic, p)) or 0) >= end for p, end in ends.items()):
                return
            fleet.check_alive()
            if time.monotonic() > deadline:
                got = sum(positions.get((topic, p)) or 0 for p in ends)
                raise TimeoutError(
                    f"{fleet.source}: {got}/{sum(ends.values())} records published after {timeout:.0f} s"
                )
            time.sleep(0.2)


def _published_rows_logged(fleet: Fleet) -> int:
    return sum(
        int(e.get("rows", 0)) + int(e.get("rejects", 0)) + int(e.get("skipped", 0))
        for e in fleet.events("segment_published")
    )


def verify(ctx: Context, source: str, topic: str, ends: dict[int, int]) -> dict[str, Any]:
    expected = {(topic, p): list(range(end)) for p, end in ends.items()}
    with Metastore(ctx.database_url) as store:
        result = verify_exactly_once(store, source, expected)
    return {"ok": result.ok, "summary": result.summary()}


def run_throughput(
    ctx: Context,
    topic: str,
    data: Produced,
    workers: int,
    spark_master: str,
    build_threads: int,
    split: SplitConfig,
    label: str,
    extra_roots: Sequence[int] = (),
    spec_extra: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], Fleet]:
    """Start ``workers`` workers on a fresh source over the pre-produced topic; time it until all is published.

    The measured span runs from the first assignment of a partition to any worker (the moment
    records start flowing; Spark start-up of the first worker is before it) to the last
    ``segment_published`` event; both are the workers' own log timestamps.  Returns the result
    and the fleet, still running (the caller reuses it or stops it).
    """
    source = ctx.new_source(label)
    apply_source(ctx, source, topic, split, spec_extra)
    ctx.log(f"[{label}] {workers} worker(s), {spark_master}, source {source}")
    fleet = start_fleet(ctx, source, workers, spark_master, build_threads, prefix=label, extra_roots=extra_roots)
    try:
        wait_published(ctx, fleet, data.ends, topic, ctx.timeout)
        done_sample = fleet.sampler.sample()
        # The metastore commit comes before the log line: give the logs a moment to catch up.
        deadline = time.monotonic() + 15
        while _published_rows_logged(fleet) < data.records and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:
        fleet.stop()
        raise
    assigned = [parse_log_time(e["timestamp"]) for e in fleet.events("partitions_assigned") if e.get("partitions")]
    published = fleet.events("segment_published")
    t_start = min(assigned) if assigned else fleet.workers[0].started_at
    t_end = max((parse_log_time(e["timestamp"]) for e in published), default=done_sample.at)
    wall = max(t_end - t_start, 1e-6)
    cpu = fleet.sampler.cpu_at(t_end) - fleet.sampler.cpu_at(t_start)
    started = [parse_log_time(e["timestamp"]) for e in fleet.events("worker_started")]
    # Cold start: the first published segment after the first worker's launch, and the rate
    # over the first million records (all of them in a smaller run) from the first assignment.
    first_n = min(data.records, 1_000_000)
    by_time = sorted(
        (parse_log_time(e["timestamp"]), int(e.get("rows", 0)) + int(e.get("rejects", 0)) + int(e.get("skipped", 0)))
        for e in published
    )
    cumulative, first_n_at = 0, t_end
    for at, rows in by_time:
        cumulative += rows
        if cumulative >= first_n:
            first_n_at = at
            break
    launched = min(w.started_at for w in fleet.workers)
    peaks = fleet.sampler.peak_rss_by_root()
    result: dict[str, Any] = {
        "system": "ingest",
        "source": source,
        "workers": workers,
        "spark_master": spark_master,
        "build_threads": build_threads,
        "records": data.records,
        "value_bytes": data.value_bytes,
        "span_start": t_start,
        "wall_s": wall,
        "records_per_s": data.records / wall,
        "mb_per_s": data.value_bytes / wall / 1e6,
        "cpu_s": cpu,
        "cpu_s_per_million": cpu / data.records * 1e6,
        # The workers' Python processes alone (their Spark JVMs, servers and executors not
        # included): what a worker costs for what Spark reads.
        "worker_process_cpu_s_per_million": fleet.sampler.own_cpu_between(
            [w.pid for w in fleet.workers if w.pid is not None], t_start, t_end
        )
        / data.records
        * 1e6,
        "peak_rss_mb": fleet.sampler.peak_rss_bytes() / 2**20,
        "peak_rss_mb_per_worker": [peaks.get(w.pid or 0, 0) / 2**20 for w in fleet.workers],
        "segments": len(published),
        # How far into the measured span the last worker was still starting (its Spark JVM,
        # then a rebalance to join): with N workers that start-up is part of the run.
        "last_worker_started_after_s": max(0.0, max(started, default=t_start) - t_start),
        "launch_to_done_s": t_end - launched,
        "first_segment_after_start_s": (by_time[0][0] - launched) if by_time else None,
        "first_million_records": first_n,
        "first_million_records_per_s": first_n / max(first_n_at - t_start, 1e-6),
        "publish_ms": [float(e["publish_ms"]) for e in published if "publish_ms" in e],
        "build_s": [float(e["build_s"]) for e in published if "build_s" in e],
    }
    return result, fleet


def steady_latency(
    ctx: Context,
    fleet: Fleet,
    topic: str,
    partitions: int,
    before: dict[int, int],
    rate: float,
    duration_s: float,
    first_id: int,
) -> tuple[dict[str, Any], dict[int, int]]:
    """Produce at a steady rate to the fleet's topic; per segment, published_at minus its newest record's
    Kafka timestamp (read from the segment's files).  Returns the result and the new log ends."""
    ctx.log(f"[latency] producing {rate:.0f} records/s for {duration_s:.0f} s to {fleet.source}'s fleet")
    steady = produce_steady(ctx.bootstrap, topic, partitions, rate, duration_s, first_id)
    ends = {p: max(before.get(p, 0), steady.ends.get(p, 0)) for p in set(before) | set(steady.ends)}
    wait_published(ctx, fleet, ends, topic, ctx.timeout)
    latencies: list[float] = []
    publish_ms: list[float] = []
    steady_ids = set()
    with Metastore(ctx.database_url) as store:
        for seg in store.segments(fleet.source):
            ranges = seg["ranges"]
            # Only segments made of the steady records (the bulk run's end is where they begin).
            if not ranges or any(r["start"] < before.get(r["partition"], 0) for r in ranges):
                continue
            newest_ms = _newest_timestamp_ms(list(seg["files"]) + list(seg["rejects_files"]))
            if newest_ms is None:
                continue
            published_at: datetime = seg["published_at"]
            latencies.append(published_at.timestamp() - newest_ms / 1000)
            steady_ids.add(int(seg["id"]))
    for e in fleet.events("segment_published"):
        if int(e.get("segment_id", -1)) in steady_ids and "publish_ms" in e:
            publish_ms.append(float(e["publish_ms"]))
    result = {
        "rate_per_s": rate,
        "duration_s": duration_s,
        "records": steady.records,
        "segments": len(latencies),
        "produce_to_visible_s": percentiles(latencies),
        "produce_to_visible_samples_s": sorted(latencies),
        "publish_ms_steady": percentiles(publish_ms),
    }
    return result, ends


def _newest_timestamp_ms(uris: Sequence[str]) -> float | None:
    newest: float | None = None
    for uri in uris:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        table = pq.read_table(path, columns=["_timestamp"], filesystem=filesystem)
        if table.num_rows == 0:
            continue
        value = pc.max(table["_timestamp"]).as_py()
        if value is not None:
            ms = value.timestamp() * 1000
            newest = ms if newest is None else max(newest, ms)
    return newest
