"""The chaos run: real PostgreSQL, a real broker, a fleet of worker processes, a producer
of unique records and faults on a seeded random schedule; at the end every produced
record must be in exactly one published segment, with its payload intact.

    python -m tests.chaos [--records 500000] [--duration 300] [--workers 3] [--seed 1] [--quick]
                          [--group-protocol classic|consumer] [--format json|avro] [--spark local|connect]

Faults (``--faults`` picks a subset): ``kill`` (SIGKILL a worker, start a replacement),
``stop`` (SIGSTOP past the session timeout, then SIGCONT: a zombie), ``add`` (one more
worker), ``term`` (SIGTERM: a graceful stop, then a replacement), ``pg_restart``,
``pg_outage`` (PostgreSQL unreachable for 20 s), ``spark`` (SIGKILL a worker's Spark JVM:
its builds fail until its /healthz reports it unhealthy and the supervisor restarts it).
With ``--spark connect`` the workers are thin clients of one Spark Connect server the run
starts (ingest_dev/spark_connect.py), and ``spark`` SIGKILLs that server and starts a new one
on the same port: every worker's session is gone with it, so every worker's builds fail until
the supervisor restarts it.
With ``--table`` (tests/chaos_table.py) two ``ingest table-commit`` processes run beside the
workers, ``table_kill`` SIGKILLs one of them, and the Iceberg table must hold every record
exactly once too. With ``--format avro`` the records are Avro in the Confluent wire format
through a local schema registry, written with three writer schema versions in turn while the run
goes on (each adds a field with a default; the spec's reader schema reads them all).

A supervisor plays the orchestrator: it restarts workers that exit on their own or whose
``/healthz`` keeps failing, and counts both. Recovery after a fault is the time from the
end of the fault until every partition's published offset moved past where it stood then
(or reached the end of what was produced). Exit status: 0 when exactly-once holds and the
fleet caught up, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.ops.gc import collect_garbage
from ingest_dev.ingest_process import IngestProcess, stop_all
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic, end_offsets, produce_records
from ingest_dev.postgres import LocalPostgres
from ingest_dev.s3 import LocalS3
from ingest_dev.spark_connect import LocalConnectServer
from ingest_dev.testkit import free_port, wait_until
from ingest_dev.verify import Verification, verify_exactly_once, verify_payloads
from metastore import Metastore, MetastoreError, apply_migrations
from tests.acceptance.harness import apply_spec, process_env, write_spec
from tests.chaos_avro import AVRO_VERSIONS, avro_values, registry_beside
from tests.chaos_table import Committers, verify_table
from tests.chaos_table import enable as enable_table

FAULT_KINDS = ("kill", "stop", "add", "term", "pg_restart", "pg_outage", "spark", "gc", "table_kill")
SESSION_TIMEOUT_S = 6.0
PG_OUTAGE_S = 20.0
# The "gc" fault runs gc with no grace at all: it abandons every split
# in flight (their publish is refused, the records read again) and sweeps what it may.
GC_FAULT_GRACE_S = 0.0
# The bound on how long a partition with lag may go without a live owner while live workers
# are in the group: the session timeout (a SIGKILLed or frozen owner is noticed) plus one
# rebalance (two rounds with cooperative-sticky) plus the assign callback's metastore
# transaction, with room for a loaded 2-core machine.
UNOWNED_BOUND_S = SESSION_TIMEOUT_S + 24.0
TOPIC = "chaos"


@dataclass(frozen=True)
class ChaosConfig:
    records: int = 500_000
    duration_s: float = 300.0
    workers: int = 3
    partitions: int = 6
    seed: int = 1
    faults: tuple[str, ...] = FAULT_KINDS
    # How many faults to inject (kinds cycled in a seeded order) and the gap between them.
    fault_count: int = 14
    gap_s: tuple[float, float] = (10.0, 20.0)
    catchup_timeout_s: float = 600.0
    # Before each fault: how long to wait for the fleet to own every partition again.
    settle_timeout_s: float = 90.0
    max_records_per_split: int = 20_000
    workdir: Path | None = None
    # The consumer group protocol: "classic" (cooperative-sticky) or "consumer" (KIP-848).
    group_protocol: str = "classic"
    # The segment store: "file" (a local directory) or "s3" (an S3 API the run starts, moto).
    store: str = "file"
    # The Iceberg table on: committers beside the workers, checked at the end (tests/chaos_table.py).
    table: bool = False
    # The source's start_from. "latest": records produced before the fleet starts must never be
    # published, and everything produced after the first claim must be, exactly once.
    start_from: str = "earliest"
    # The records' format: "json", or "avro" through a local schema registry (three writer
    # schema versions, in turn over the production).
    format: str = "json"
    # The workers' Spark: "local" (a JVM in each worker) or "connect" (one Spark Connect server
    # the run starts, ``local[2]``; the workers are thin clients).
    spark: str = "local"

    def __post_init__(self) -> None:
        # Without committers there is nothing for table_kill to hit (the default kinds include it).
        if "table_kill" in self.faults and not self.table:
            object.__setattr__(self, "faults", tuple(f for f in self.faults if f != "table_kill"))

    @classmethod
    def quick(
        cls,
        seed: int = 1,
        workdir: Path | None = None,
        store: str = "file",
        table: bool = False,
        start_from: str = "earliest",
        format: str = "json",
        spark: str = "local",
    ) -> ChaosConfig:
        """The CI variant: ~20k records, one fault of each kind, a few minutes on a loaded 2-core machine."""
        # Production spans the faults (a worker restart with Spark takes ~20-30 s here), so
        # each fault meets partitions with lag and the ownership bound is exercised.
        return cls(
            records=20_000,
            duration_s=150.0,
            workers=2,
            partitions=4,
            seed=seed,
            faults=("kill", "stop", "term", "add", "pg_outage", "spark", "pg_restart", "gc")
            + (("table_kill",) if table else ()),
            fault_count=9 if table else 8,
            gap_s=(6.0, 10.0),
            catchup_timeout_s=240.0,
            max_records_per_split=2_000,
            workdir=workdir,
            store=store,
            table=table,
            start_from=start_from,
            format=format,
            spark=spark,
        )


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    # Published offsets when the fault ended; recovered once every partition moved past them.
    baseline: dict[int, int] = field(default_factory=dict)
    recovered: float | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered is None else max(0.0, self.recovered - self.ended)


@dataclass
class ChaosResult:
    config: ChaosConfig
    produced: int
    verification: Verification
    payload_rows: int
    payload_errors: list[str]
    caught_up: bool
    faults: list[Fault]
    conflicts: dict[str, int]
    splits_killed: Counter[str]
    unplanned_exits: int
    health_restarts: int
    producer_errors: list[str]
    elapsed_s: float
    broker: str = ""
    # Builds the final gc could not sweep (it must sweep every one).
    final_gc_problems: list[str] = field(default_factory=list)
    # The longest a partition with lag had no live owner while live workers were in the group:
    # (seconds, partition, seconds since the start when it began).
    unowned_worst: tuple[float, int, float] = (0.0, -1, 0.0)
    ownership_samples: int = 0
    # With the table on: rows the tables hold and what is wrong with them (nothing, when exactly once).
    table_rows: int = 0
    table_errors: list[str] = field(default_factory=list)

    @property
    def ownership_ok(self) -> bool:
        return self.ownership_samples > 0 and self.unowned_worst[0] <= UNOWNED_BOUND_S

    @property
    def ok(self) -> bool:
        return (
            self.verification.ok
            and not self.payload_errors
            and self.caught_up
            and not self.producer_errors
            and self.verification.rows == self.produced
            and self.ownership_ok
            and not self.final_gc_problems
            and not self.table_errors
        )

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        lines = [
            f"chaos run seed={self.config.seed} group protocol {self.config.group_protocol}, "
            f"{self.config.store} store, {self.config.format} records, Spark {self.config.spark}: "
            f"{'OK' if self.ok else 'FAILED'} in {self.elapsed_s:.0f}s",
            f"  records produced {self.produced}, published rows {self.verification.rows}, "
            f"segments {self.verification.segments}, payloads checked {self.payload_rows}",
            f"  exactly-once: {self.verification.summary()}",
            f"  payload mismatches {len(self.payload_errors)}"
            + (f": {self.payload_errors[:3]}" if self.payload_errors else ""),
            f"  broker: {self.broker}",
            f"  caught up: {self.caught_up}; producer errors: {len(self.producer_errors)}"
            + (f": {self.producer_errors[:2]}" if self.producer_errors else ""),
            f"  longest a lagging partition had no live owner: {self.unowned_worst[0]:.1f}s "
            + (
                f"(partition {self.unowned_worst[1]} from t={self.unowned_worst[2]:.1f}s; "
                if self.unowned_worst[1] >= 0
                else "("
            )
            + f"bound {UNOWNED_BOUND_S:.0f}s, {self.ownership_samples} samples of the group): "
            + ("ok" if self.ownership_ok else "EXCEEDED"),
            f"  final gc (no grace) could not sweep: {self.final_gc_problems or 'none'}",
            *(
                [f"  iceberg table: {self.table_rows} rows; " + ("; ".join(self.table_errors) or "exactly once")]
                if self.config.table
                else []
            ),
            "  faults injected: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())),
            "  publish conflicts rejected: "
            + (", ".join(f"{k}={n}" for k, n in sorted(self.conflicts.items())) or "0"),
            "  splits killed: " + (", ".join(f"{k}={n}" for k, n in sorted(self.splits_killed.items())) or "0"),
            f"  workers restarted by the supervisor: exited on their own {self.unplanned_exits}, "
            f"unhealthy {self.health_restarts}",
            "  recovery after each fault:",
        ]
        for f in self.faults:
            rec = f"{f.recovery_s:.1f}s" if f.recovery_s is not None else "not measured (no progress seen)"
            lines.append(
                f"    t={f.started:6.1f}s {f.kind:<10} {f.target:<10} lasted {f.ended - f.started:5.1f}s, "
                f"recovered in {rec}"
            )
        if not self.verification.ok:
            v = self.verification

            def head(d: dict[tuple[str, int], list[int]]) -> dict[str, str]:
                return {f"{t}[{p}]": f"{len(o)} from {o[0]}" for (t, p), o in list(d.items())[:4] if o}

            lines.append(
                f"  first problems: missing={head(v.missing)} duplicates={head(v.duplicates)} "
                f"{v.range_errors[:3]} {v.offset_errors[:3]}"
            )
        return "\n".join(lines)


def _log(t0: float, message: str) -> None:
    print(f"[chaos {time.monotonic() - t0:7.1f}s] {message}", flush=True)


# --------------------------------------------------------------------------- the records


def record_fields(i: int) -> dict[str, Any]:
    """Record ``i``'s fields; :func:`expected_row` is the row it must become."""
    return {
        "id": i,
        "user": f"user-{i % 997}-{i * 7919 % 100_003}",
        "ts": _ts(i),
        "amount": i * 0.25,
        "tags": ["c", str(i % 11), str(i)],
    }


def record_value(i: int) -> bytes:
    """Record ``i``'s value in JSON."""
    return json.dumps({**record_fields(i), "ts": _ts(i).isoformat()}).encode()


def _ts(i: int) -> datetime:
    return datetime.fromtimestamp(1_790_000_000 + i, tz=UTC)


def expected_row(i: int) -> dict[str, Any]:
    return {"_key": str(i).encode(), **record_fields(i)}


class ChaosProducer:
    """Produces ids 0..records-1 at an even pace over ``duration_s`` (bounded by both), and
    keeps from the delivery reports which id landed at which (partition, offset)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        records: int,
        duration_s: float,
        value: Callable[[int], bytes] = record_value,
    ) -> None:
        from confluent_kafka import Producer

        self.value = value
        self.topic = topic
        self.partitions = partitions
        self.records = records
        self.duration_s = duration_s
        self.delivered: dict[int, dict[int, int]] = {p: {} for p in range(partitions)}
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 20,
                "batch.num.messages": 2000,
                "queue.buffering.max.messages": 200_000,
                "partitioner": "murmur2_random",
                # Long enough never to give up on a record while the broker is healthy: a record
                # reported failed might still be in the log, which the check could not explain.
                "message.timeout.ms": 600_000,
            }
        )
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self.done = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def ends(self) -> dict[int, int]:
        with self._lock:
            return {p: (max(d) + 1 if d else 0) for p, d in self.delivered.items()}

    def delivered_count(self) -> int:
        with self._lock:
            return sum(len(d) for d in self.delivered.values())

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.key()!r}: {err}")
            return
        with self._lock:
            self.delivered[msg.partition()][msg.offset()] = int(msg.key())

    def _run(self) -> None:
        started = time.monotonic()
        deadline = started + self.duration_s * 2 + 60
        try:
            while self.sent < self.records and time.monotonic() < deadline:
                elapsed = time.monotonic() - started
                due = min(self.records, int(self.records * min(1.0, elapsed / self.duration_s)) + 1)
                while self.sent < due:
                    i = self.sent
                    try:
                        self._producer.produce(
                            self.topic,
                            value=self.value(i),
                            key=str(i).encode(),
                            partition=i % self.partitions,
                            on_delivery=self._on_delivery,
                        )
                    except BufferError:
                        self._producer.poll(0.05)
                        continue
                    self.sent += 1
                self._producer.poll(0.05)
            remaining = self._producer.flush(120)
            if remaining:
                self.errors.append(f"{remaining} records still undelivered after the final flush")
        finally:
            self.done.set()


# --------------------------------------------------------------------------- the fleet


class Fleet:
    """Worker processes with metrics ports, and the supervisor that restarts the ones that
    exit on their own or report themselves unhealthy."""

    @property
    def source_name(self) -> str:
        return self._source

    def __init__(self, env: dict[str, str], source: str, log_dir: Path, t0: float) -> None:
        self._env = env
        self._source = source
        self._log_dir = log_dir
        self._t0 = t0
        self._lock = threading.RLock()
        self._seq = 0
        self.live: dict[str, tuple[IngestProcess, int]] = {}
        self.all: list[IngestProcess] = []
        self.frozen: set[str] = set()
        self.unplanned_exits = 0
        self.health_restarts = 0
        self._unhealthy_seen: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    def start(self, n: int) -> None:
        for _ in range(n):
            self.add()
        self._thread.start()

    def add(self) -> str:
        with self._lock:
            name = f"w{self._seq}"
            self._seq += 1
            port = free_port()
            env = {**self._env, "INGEST_METRICS_PORT": str(port), "INGEST_WORKER_ID": f"chaos-{name}"}
            worker = IngestProcess.worker(env, self._source, self._log_dir, name)
            self.live[name] = (worker, port)
            self.all.append(worker)
            return name

    def pick(self, rng: random.Random) -> str | None:
        """A worker to fault: one that owns partitions when there is one (a fault on a worker
        still starting Spark tests nothing of the group)."""
        with self._lock:
            names = sorted(n for n in self.live if n not in self.frozen)
        owners = [n for n in names if self.ready(n)]
        pool = owners or names
        return rng.choice(pool) if pool else None

    def worker(self, name: str) -> IngestProcess:
        with self._lock:
            return self.live[name][0]

    def remove(self, name: str) -> IngestProcess:
        with self._lock:
            return self.live.pop(name)[0]

    def spark_jvm(self, name: str) -> int | None:
        """Pid of the Spark JVM under a worker process (a child or grandchild running java)."""
        root = self.worker(name).pid
        if root is None:
            return None
        out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True, check=False)
        children: dict[int, list[tuple[int, str]]] = {}
        for line in out.stdout.splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                children.setdefault(int(parts[1]), []).append((int(parts[0]), parts[2]))
        queue = [root]
        for _ in range(1000):
            if not queue:
                break
            pid = queue.pop()
            for child, comm in children.get(pid, []):
                if comm == "java":
                    return child
                queue.append(child)
        return None

    def ready(self, name: str) -> bool:
        with self._lock:
            entry = self.live.get(name)
        if entry is None or name in self.frozen:
            return False
        probe = self._healthz(entry[1], "readyz")
        return probe is not None and probe[0] == 200

    def live_client_ids(self) -> set[str]:
        """Client ids of the worker processes that run and are not frozen (SIGSTOP), those
        being stopped included: a draining worker owns its partitions until it leaves."""
        with self._lock:
            return {
                f"chaos-{worker.name}"
                for worker in self.all
                if worker.name not in self.frozen and worker.poll() is None
            }

    def _healthz(self, port: int, path: str = "healthz") -> tuple[int, str] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=3) as resp:
                return int(resp.status), resp.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace").strip()
        except OSError:
            return None  # not serving yet (starting) or gone

    def _supervise(self) -> None:
        while not self._stop.wait(2.0):
            with self._lock:
                snapshot = list(self.live.items())
            for name, (worker, port) in snapshot:
                if name in self.frozen:
                    continue
                code = worker.poll()
                if code is not None:
                    with self._lock:
                        if self.live.pop(name, None) is None:
                            continue
                        self.unplanned_exits += 1
                        new = self.add()
                    _log(self._t0, f"supervisor: {name} exited on its own (code {code}); started {new}")
                    continue
                probe = self._healthz(port)
                if probe is not None and probe[0] == 503 and "splits failed" in probe[1]:
                    self._unhealthy_seen[name] += 1
                    if self._unhealthy_seen[name] >= 2:
                        with self._lock:
                            if self.live.pop(name, None) is None:
                                continue
                            self.health_restarts += 1
                            new = self.add()
                        _log(self._t0, f"supervisor: {name} unhealthy ({probe[1]}); restarting as {new}")
                        # As an orchestrator's liveness restart: SIGTERM now, SIGKILL after the grace.
                        threading.Thread(target=_stop_worker, args=(worker, 30.0), daemon=True).start()

    def shutdown(self, timeout: float = 90.0) -> None:
        self._stop.set()
        self._thread.join(10)
        stop_all(self.all, timeout)


def _stop_worker(worker: IngestProcess, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` (as an orchestrator's grace period)."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed with its group, as a pod would be
        worker.stop(timeout=timeout)


# --------------------------------------------------------------------------- the run


class Monitor:
    """Polls the published offsets to time each fault's recovery."""

    def __init__(self, url: str, source: str, producer: ChaosProducer, t0: float) -> None:
        self._t0 = t0  # fault times are seconds since the run started
        self._url = url
        self._source = source
        self._producer = producer
        self.faults: list[Fault] = []
        self.positions: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def ended(self, fault: Fault) -> None:
        with self._lock:
            fault.baseline = dict(self.positions)
            self.faults.append(fault)

    def _run(self) -> None:
        store = Metastore(self._url)
        try:
            while not self._stop.wait(0.5):
                try:
                    rows = store.partitions(self._source)
                except MetastoreError:
                    continue  # an outage: the run itself injected it
                now = time.monotonic() - self._t0
                ends = self._producer.ends()
                with self._lock:
                    self.positions = {int(r["partition"]): int(r["next_offset"] or 0) for r in rows}
                    for fault in self.faults:
                        if fault.recovered is None and all(
                            self.positions.get(p, 0) > fault.baseline.get(p, 0)
                            or self.positions.get(p, 0) >= ends.get(p, 0)
                            for p in ends
                        ):
                            fault.recovered = now
        finally:
            store.close()


class OwnershipWatch:
    """Kafka's own view of who owns what, sampled every second: how long a partition with lag
    went without a live owner (a member that runs and is not frozen) while at least one live
    worker was in the group. That is the stall the chaos run bounds (``UNOWNED_BOUND_S``)."""

    def __init__(self, bootstrap: str, group: str, topic: str, fleet: Fleet, monitor: Monitor, t0: float) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._bootstrap = bootstrap
        self._group = group
        self._topic = topic
        self._fleet = fleet
        self._monitor = monitor
        self._t0 = t0
        self._since: dict[int, float] = {}
        # (seconds unowned, partition, when it started, seconds since t0)
        self.worst: tuple[float, int, float] = (0.0, -1, 0.0)
        self.samples = 0
        # The last sample: when it was taken, and which partitions had a live owner then.
        self._last: tuple[float, set[int], int] = (0.0, set(), 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-ownership", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        now = time.monotonic()
        for partition, since in self._since.items():
            self._close(partition, since, now)

    def settled(self, after: float) -> bool:
        """A sample taken after ``after`` saw every partition owned by a live, unfrozen worker."""
        at, owned, partitions = self._last
        return at > after and partitions > 0 and len(owned) == partitions

    def _close(self, partition: int, since: float, now: float) -> None:
        if now - since > self.worst[0]:
            self.worst = (now - since, partition, since - self._t0)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                description = self._admin.describe_consumer_groups([self._group], request_timeout=5)[self._group]
                members = description.result(timeout=10).members
                ends = end_offsets(self._bootstrap, self._topic, timeout=5)
            except Exception:  # the group is being formed, or the broker is busy: no sample
                continue
            now = time.monotonic()
            live = self._fleet.live_client_ids()
            live_members = [m for m in members if m.client_id in live]
            owned = {
                tp.partition
                for m in live_members
                for tp in (m.assignment.topic_partitions or [])
                if tp.topic == self._topic
            }
            positions = self._monitor.positions
            self.samples += 1
            self._last = (now, owned & set(ends), len(ends))
            for partition, end in ends.items():
                lagging = end > positions.get(partition, 0)
                if live_members and lagging and partition not in owned:
                    self._since.setdefault(partition, now)
                elif partition in self._since:
                    self._close(partition, self._since.pop(partition), now)


def _fault_plan(config: ChaosConfig, rng: random.Random) -> list[str]:
    kinds = list(config.faults)
    plan: list[str] = []
    while len(plan) < config.fault_count:
        rng.shuffle(kinds)
        plan.extend(kinds)
    return plan[: config.fault_count]


def _inject(
    kind: str,
    fleet: Fleet,
    pg: LocalPostgres,
    rng: random.Random,
    max_workers: int,
    t0: float,
    connect: LocalConnectServer | None = None,
) -> tuple[str, str]:
    """Inject one fault; returns what it hit and the kind actually injected."""
    if kind == "spark" and connect is not None:
        down_s = connect.crash_and_restart()
        _log(t0, f"the Spark Connect server was killed and listens again after {down_s:.1f}s")
        return "connect", kind
    if kind == "pg_restart":
        pg.restart()
        return "postgres", kind
    if kind == "pg_outage":
        pg.outage(PG_OUTAGE_S)
        return "postgres", kind
    if kind == "gc":
        with Metastore(pg.url) as store:
            swept = collect_garbage(store, fleet.source_name, grace_s=GC_FAULT_GRACE_S)
        _log(
            t0,
            f"gc abandoned {swept.abandoned} split(s), deleted {len(swept.deleted)} file(s) of {swept.swept} build(s)",
        )
        return "store", kind
    if kind == "add":
        if len(fleet.live) >= max_workers:
            kind = "kill"
        else:
            return fleet.add(), "add"
    name = fleet.pick(rng)
    if name is None:
        return fleet.add(), "add"
    if kind == "kill":
        fleet.remove(name).kill()
        fleet.add()
    elif kind == "term":
        worker = fleet.remove(name)
        _stop_worker(worker, 90.0)
        fleet.add()
    elif kind == "stop":
        worker = fleet.worker(name)
        fleet.frozen.add(name)
        worker.signal(signal.SIGSTOP)
        time.sleep(SESSION_TIMEOUT_S + rng.uniform(2.0, 5.0))
        worker.signal(signal.SIGCONT)
        fleet.frozen.discard(name)
    elif kind == "spark":
        pid = fleet.spark_jvm(name)
        if pid is None:
            _log(t0, f"{name} has no Spark JVM yet; killing the worker instead")
            fleet.remove(name).kill()
            fleet.add()
            return name, "kill"
        os.kill(pid, signal.SIGKILL)
    return name, kind


def _caught_up(url: str, source: str, ends: Mapping[int, int]) -> bool:
    try:
        with Metastore(url) as store:
            positions = {int(r["partition"]): r["next_offset"] for r in store.partitions(source)}
    except MetastoreError:
        return False
    return all(positions.get(p) == end for p, end in ends.items() if end)


def _count_kills(workers: list[IngestProcess]) -> Counter[str]:
    kills: Counter[str] = Counter()
    for worker in workers:
        for event in worker.events():
            if event.get("event") == "split_killed":
                kills[str(event.get("reason"))] += 1
    return kills


@contextlib.contextmanager
def _connect_server(config: ChaosConfig) -> Iterator[LocalConnectServer | None]:
    if config.spark != "connect":
        yield None
        return
    with LocalConnectServer(driver_memory="1g", master="local[2]") as server:
        yield server


@contextlib.contextmanager
def _store(config: ChaosConfig, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The segment store's URI and what a process needs to reach it. For S3 the variables are
    also set in this process for the run (the final gc and the verification read the files)."""
    if config.store == "file":
        yield str(work / "store"), {}
        return
    saved = dict(os.environ)
    with LocalS3() as s3:
        os.environ.update(s3.env)
        try:
            yield s3.uri("chaos-store"), s3.env
        finally:
            os.environ.clear()
            os.environ.update(saved)


def run(config: ChaosConfig, log: Callable[[str], None] | None = None) -> ChaosResult:
    t0 = time.monotonic()
    say = log or (lambda message: _log(t0, message))
    rng = random.Random(config.seed)
    work = config.workdir or Path(tempfile.mkdtemp(prefix="ingest-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    say(
        f"seed {config.seed}; workdir {work}; {config.records} records over {config.duration_s:.0f}s, "
        f"{config.workers} workers, {config.partitions} partitions, group protocol {config.group_protocol}, "
        f"{config.store} store, {config.format} records, Spark {config.spark}"
    )
    with (
        registry_beside(config.format == "avro", work) as registry,
        LocalPostgres() as pg,
        LocalKafka(base_dir=work / "broker") as broker,
        _store(config, work) as (store, s3env),
        _connect_server(config) as connect,
    ):
        say(f"broker: {broker.describe()}, started in {broker.started_in_s:.1f} s")
        url = pg.url
        apply_migrations(url)
        create_topic(broker.bootstrap, TOPIC, config.partitions)
        extra = f'start_from = "{config.start_from}"'
        value = record_value
        if registry is not None:
            registry_url = registry()
            say(f"schema registry at {registry_url}; {len(AVRO_VERSIONS)} writer schema versions to produce")
            value = avro_values(registry_url, TOPIC, config.records, record_fields)
            extra += f'\nformat = "avro"\n\n[registry]\nurl = "{registry_url}"\n'
        source, spec_path = write_spec(
            work,
            TOPIC,
            name="chaos",
            max_records=config.max_records_per_split,
            max_age="2s",
            store=store,
            extra=extra,
        )
        if config.start_from == "latest":
            # Before the source reads: none of these may ever be published (verify's "unexpected").
            before = produce_records(
                broker.bootstrap, TOPIC, ((p % config.partitions, None, b'{"before": true}') for p in range(500))
            )
            say(f"start_from latest: {sum(before.values())} records produced before the fleet starts")
        apply_spec(url, spec_path)
        # A one-minute rebalance timeout (max.poll.interval.ms; the loop never blocks poll()
        # that long).
        spark = {} if connect is None else {"INGEST_SPARK_MASTER": connect.url}
        if connect is not None:
            say(f"Spark Connect server {connect.url}, listening after {connect.start_seconds:.1f} s")
        env = process_env(
            url,
            broker.bootstrap,
            config.group_protocol,
            INGEST_KAFKA_PROP_MAX_POLL_INTERVAL_MS="60000",
            **s3env,
            **spark,
        )
        fleet = Fleet(env, source, work, t0)
        committers = Committers(env, source, work) if config.table else None
        if committers is not None:
            enable_table(url, source)
            committers.start()
        producer = ChaosProducer(broker.bootstrap, TOPIC, config.partitions, config.records, config.duration_s, value)
        monitor = Monitor(url, source, producer, t0)
        ownership = OwnershipWatch(broker.bootstrap, f"ingest-{source}", TOPIC, fleet, monitor, t0)
        try:
            fleet.start(config.workers)
            # Workers start Spark before they join the group (tens of seconds on a loaded
            # machine): produce only once the fleet consumes, so the faults hit production.
            say("waiting for the fleet to own every partition")
            wait_until(
                lambda: _fleet_ready(url, source, config.workers, config.partitions),
                300,
                "chaos: the workers to join and own every partition",
                interval=1.0,
            )
            producer.start()
            monitor.start()
            ownership.start()
            say("fleet ready; producing; waiting for the first segment before injecting faults")
            wait_until(lambda: _published_any(url, source), 180, "chaos: the first worker to publish", interval=1.0)
            plan = _fault_plan(config, rng)
            say(f"fault plan: {', '.join(plan)}")
            for kind in plan:
                time.sleep(rng.uniform(*config.gap_s))
                # Each fault hits a fleet that owns every partition again (a kill of a worker
                # still starting Spark tests nothing of the group); bounded, then injected anyway.
                waited = time.monotonic()
                while not ownership.settled(waited) and time.monotonic() - waited < config.settle_timeout_s:
                    time.sleep(0.5)
                if not ownership.settled(waited):
                    say(
                        f"the fleet did not own every partition within {config.settle_timeout_s:.0f}s; "
                        f"injecting {kind} anyway"
                    )
                started = time.monotonic()
                if kind == "table_kill" and committers is not None:
                    target, injected = committers.kill_one(), kind
                else:
                    target, injected = _inject(kind, fleet, pg, rng, config.workers + 2, t0, connect)
                fault = Fault(injected, target, started - t0, time.monotonic() - t0)
                monitor.ended(fault)
                say(
                    f"fault {injected} on {target} ({fault.ended - fault.started:.1f}s); "
                    f"delivered {producer.delivered_count()}/{config.records}"
                )
            producer.join(config.duration_s * 2 + 200)
            say(
                f"producer done: {producer.delivered_count()} delivered, {len(producer.errors)} errors; "
                "waiting for the fleet to catch up"
            )
            # Caught up means at Kafka's end offsets; with a single, non-transactional producer
            # they must equal what the delivery reports say was written.
            ends = end_offsets(broker.bootstrap, TOPIC)
            if {p: e for p, e in ends.items() if e} != {p: e for p, e in producer.ends().items() if e}:
                producer.errors.append(f"Kafka's end offsets {ends} differ from the delivery reports {producer.ends()}")
            try:
                caught_up = wait_until(
                    lambda: _caught_up(url, source, ends), config.catchup_timeout_s, "the catch-up", interval=1.0
                )
            except TimeoutError:
                caught_up = False  # reported with the verification below
            # Let the monitor see the final positions before it stops.
            time.sleep(1.5)
        finally:
            ownership.stop()
            monitor.stop()
            fleet.shutdown()
            committer_exits = committers.exited() if committers is not None else []
            if committers is not None:
                committers.stop()
        expected = {(TOPIC, p): sorted(d) for p, d in producer.delivered.items()}
        ids = producer.delivered
        with Metastore(url) as store:
            # Every split is settled now: gc with no grace at all must leave every published file.
            final_gc = collect_garbage(store, source, grace_s=0.0)
            say(
                f"caught up: {caught_up}; gc deleted {len(final_gc.deleted)} unpublished file(s) of "
                f"{final_gc.swept} build(s); verifying every published file"
            )
            verification = verify_exactly_once(store, source, expected)
            conflicts = store.conflict_counts(source)

            def want(topic: str, partition: int, offset: int) -> dict[str, Any] | None:
                i = ids.get(partition, {}).get(offset) if topic == TOPIC else None
                return None if i is None else expected_row(i)

            payload_rows, payload_errors = verify_payloads(
                store, source, want, ["_key", "id", "user", "ts", "amount", "tags"]
            )
        table_rows, table_errors = verify_table(url, source, expected) if config.table else (0, [])
        table_errors += [f"a committer exited on its own (exit {rc})" for rc in committer_exits]
        if config.table:
            say(f"iceberg table: {table_rows} rows; {'; '.join(table_errors) or 'exactly once'}")
        return ChaosResult(
            config=config,
            produced=producer.delivered_count(),
            verification=verification,
            payload_rows=payload_rows,
            payload_errors=payload_errors,
            caught_up=caught_up,
            faults=monitor.faults,
            conflicts=conflicts,
            splits_killed=_count_kills(fleet.all),
            final_gc_problems=final_gc.unsafe,
            table_rows=table_rows,
            table_errors=table_errors,
            unplanned_exits=fleet.unplanned_exits,
            health_restarts=fleet.health_restarts,
            producer_errors=producer.errors,
            elapsed_s=time.monotonic() - t0,
            broker=broker.describe(),
            unowned_worst=ownership.worst,
            ownership_samples=ownership.samples,
        )


def _fleet_ready(url: str, source: str, workers: int, partitions: int) -> bool:
    try:
        with Metastore(url) as store:
            live = [w for w in store.live_workers(source) if w["state"] == "running"]
    except MetastoreError:
        return False
    owned = {tp for w in live for tp in w["partitions"]}
    return len(live) >= workers and len(owned) == partitions


def _published_any(url: str, source: str) -> bool:
    try:
        with Metastore(url) as store:
            return bool(store.segments(source))
    except MetastoreError:
        return False


def _iter_kinds(text: str) -> Iterator[str]:
    for kind in text.split(","):
        kind = kind.strip()
        if kind not in FAULT_KINDS:
            raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        yield kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the CI variant (~20k records, 5 faults)")
    parser.add_argument("--records", type=int, help="unique records to produce (default 500000)")
    parser.add_argument("--duration", type=float, help="seconds to spread the production over (default 300)")
    parser.add_argument("--workers", type=int, help="initial fleet size (default 3)")
    parser.add_argument("--partitions", type=int, help="topic partitions (default 6)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=lambda t: tuple(_iter_kinds(t)), help="comma-separated fault kinds")
    parser.add_argument("--fault-count", type=int, help="faults to inject (default 14)")
    parser.add_argument("--workdir", type=Path, help="keep logs, broker log and segments here")
    parser.add_argument(
        "--store",
        choices=("file", "s3"),
        help="segment store: a local directory (default) or an S3 API the run starts (moto)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="run table committers beside the workers (fault table_kill) and check the Iceberg table",
    )
    parser.add_argument(
        "--start-from",
        choices=("earliest", "latest"),
        help="the source's start_from (latest: records produced before the fleet starts must stay out)",
    )
    parser.add_argument(
        "--format",
        choices=("json", "avro"),
        help="the records: JSON (default), or Avro through a local schema registry, three writer schema versions",
    )
    parser.add_argument(
        "--spark",
        choices=("local", "connect"),
        help="the workers' Spark: a JVM in each (default), or one Spark Connect server the run starts",
    )
    parser.add_argument(
        "--group-protocol",
        choices=("classic", "consumer"),
        help="consumer group protocol: classic cooperative-sticky (default) or KIP-848's consumer",
    )
    args = parser.parse_args(argv)
    config = (
        ChaosConfig.quick(args.seed, args.workdir, table=args.table)
        if args.quick
        else ChaosConfig(seed=args.seed, workdir=args.workdir, table=args.table)
    )
    overrides = {
        "records": args.records,
        "duration_s": args.duration,
        "workers": args.workers,
        "partitions": args.partitions,
        "faults": args.faults,
        "fault_count": args.fault_count,
        "group_protocol": args.group_protocol,
        "store": args.store,
        "start_from": args.start_from,
        "format": args.format,
        "spark": args.spark,
    }
    from dataclasses import replace

    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if config.records <= 0 or config.workers <= 0 or config.duration_s <= 0:
        parser.error("--records, --workers and --duration must be positive")
    result = run(config)
    print(result.summary(), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
