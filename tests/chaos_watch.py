"""What the chaos run watches while faults go on: the published offsets (each fault's
recovery time) and Kafka's view of who owns each partition (how long one with lag had no live owner);
and the metastore's answers it waits for (the fleet owns every partition, a first segment, caught up)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from ingest_dev.kafka_clients import end_offsets
from metastore import Metastore, MetastoreError
from tests.chaos_fleet import Fleet
from tests.chaos_kafka import KafkaClients
from tests.chaos_records import ChaosProducer
from tests.chaos_result import Fault


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

    def __init__(self, kafka: KafkaClients, group: str, topic: str, fleet: Fleet, monitor: Monitor, t0: float) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient(kafka.config())
        self._kafka = kafka
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
                ends = end_offsets(self._kafka.bootstrap, self._topic, timeout=5, config=self._kafka.props)
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


def caught_up_to(url: str, source: str, ends: Mapping[int, int]) -> bool:
    """Every partition's published position is at ``ends`` (what was produced)."""
    try:
        with Metastore(url) as store:
            positions = {int(r["partition"]): r["next_offset"] for r in store.partitions(source)}
    except MetastoreError:
        return False
    return all(positions.get(p) == end for p, end in ends.items() if end)


def fleet_ready(url: str, source: str, workers: int, partitions: int) -> bool:
    """At least ``workers`` run, and together they own all ``partitions``."""
    try:
        with Metastore(url) as store:
            live = [w for w in store.live_workers(source) if w["state"] == "running"]
    except MetastoreError:
        return False
    owned = {tp for w in live for tp in w["partitions"]}
    return len(live) >= workers and len(owned) == partitions


def published_any(url: str, source: str) -> bool:
    """A first segment is published."""
    try:
        with Metastore(url) as store:
            return bool(store.segments(source))
    except MetastoreError:
        return False
