"""Records re-consumed per rebalance: a fleet whose splits never seal goes through a scale-up, a
plain consumer joining and leaving the group, and a scale-down after a drain; each event's
re-reads are counted from the workers' consumed counters and assignment logs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.data import produce_dataset
from bench.ingest_runs import Context, SplitConfig, apply_source, start_fleet, verify
from bench.procs import WorkerProcess, metric, parse_log_time
from ingest_dev.kafka_clients import create_topic


def _consumed(worker: WorkerProcess) -> int:
    return int(metric(worker.metrics(), "ingest_records_consumed_total"))


def _assigned(worker: WorkerProcess) -> float:
    return metric(worker.metrics(), "ingest_assigned_partitions")


def _settle(
    workers: Sequence[WorkerProcess],
    partitions: int,
    quiet_s: float,
    timeout: float,
    ready: Callable[[], bool] = lambda: True,
) -> float:
    """Wait until the live workers hold every partition, ``ready()`` holds and no consumed counter
    moved for ``quiet_s``.  Returns the seconds waited."""
    started = time.monotonic()
    deadline = started + timeout
    last: list[int] | None = None
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        live = [w for w in workers if w.is_running()]
        counts = [_consumed(w) for w in live]
        held = sum(_assigned(w) for w in live)
        if counts != last:
            last, quiet_since = counts, time.monotonic()
        if held == partitions and ready() and time.monotonic() - quiet_since >= quiet_s:
            return time.monotonic() - started
        time.sleep(0.25)
    raise TimeoutError(f"group did not settle within {timeout:.0f} s")


def _assigned_since(workers: Sequence[WorkerProcess], since: float) -> dict[int, int]:
    """Partitions newly assigned after ``since`` and the offset each new owner started from
    (``partitions_assigned`` logs ``topic[p]@offset#serial``; no stored offset yet means 0)."""
    starts: dict[int, int] = {}
    for w in workers:
        for e in w.events("partitions_assigned"):
            if parse_log_time(e["timestamp"]) < since:
                continue
            for item in e.get("partitions", []):
                tp, _, rest = str(item).partition("@")
                offset = rest.split("#", 1)[0]
                starts[int(tp[tp.rfind("[") + 1 : -1])] = int(offset) if offset.isdigit() else 0
    return starts


def _dropped_since(workers: Sequence[WorkerProcess], since: float) -> int:
    return sum(
        int(e.get("buffered_records_dropped", 0))
        for w in workers
        for e in w.events("partitions_revoked")
        if parse_log_time(e["timestamp"]) >= since
    )


class GroupMember:
    """A plain confluent-kafka consumer in a worker group: joining and leaving makes the group
    rebalance without moving any partition when the workers already hold one each (sticky
    assignment keeps a balanced group as it is).  It never commits and starts at ``latest``, so
    even if it were given a partition it would read nothing already in the topic."""

    def __init__(self, bootstrap: str, group: str, topic: str, timeout: float) -> None:
        from confluent_kafka import Consumer

        self.assigned: list[int] | None = None
        self.received = 0
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "enable.auto.commit": False,
                "auto.offset.reset": "latest",
            }
        )
        self._topic = topic
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-member", daemon=True)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned = sorted([*(self.assigned or []), *(p.partition for p in partitions)])

    def _run(self) -> None:
        # Every consumer call stays on this thread (FIELD-NOTES: cross-thread calls can block).
        self._consumer.subscribe([self._topic], on_assign=self._on_assign)
        deadline = time.monotonic() + self._timeout
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                msg = self._consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    self.received += 1
        finally:
            self._consumer.close()  # leaves the group: the second rebalance

    def start(self) -> GroupMember:
        self._thread.start()
        return self

    def leave(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _rebalanced_since(workers: Sequence[WorkerProcess], since: float) -> bool:
    """Every live worker went through an assignment callback (empty or not) after ``since``."""
    return all(
        any(parse_log_time(e["timestamp"]) >= since for e in w.events("partitions_assigned"))
        for w in workers
        if w.is_running()
    )


def run_rebalance(ctx: Context, topic: str, records: int, spark_master: str) -> dict[str, Any]:
    """Records re-consumed per rebalance, on a 2-partition topic with everything held in buffers.

    Splits never seal (huge max_records, max_age 1 h): every consumed record stays buffered, so
    any record a worker reads twice shows up in its ``ingest_records_consumed_total``.  Events:

    1. scale-up 1→2: one partition moves; the worker that keeps the other must re-read 0, the new
       owner re-reads the moved partition from its stored offset (its buffer was never published);
    2. a plain consumer joins the group and leaves it again: two rebalances that move no partition
       (two partitions, already one per worker); both workers must re-read 0.  A plain consumer
       rather than a third worker because it costs no Spark JVM (~10 s to start on 2 cores);
    3. scale-down 2→1: SIGTERM a worker; it publishes what it holds before leaving, so the worker
       that takes its partition starts at the log end and re-reads 0.
    """
    partitions = 2
    create_topic(ctx.bootstrap, topic, partitions)
    data = produce_dataset(ctx.bootstrap, topic, records, partitions)
    source = ctx.new_source("rebalance")
    apply_source(ctx, source, topic, SplitConfig(max_records=100_000_000, max_bytes="8GiB", max_age="1h"))
    ctx.log(f"[rebalance] {records} records on {partitions} partitions, source {source}")
    fleet = start_fleet(ctx, source, 0, spark_master, 1, prefix="rebalance")
    # Nothing here is timed against a build (splits seal only at the drain): no JIT warm-up
    # before a worker joins, so the events follow each other sooner.
    fleet.env["INGEST_WARM_UP_RECORDS"] = "0"
    events: list[dict[str, Any]] = []
    try:
        a = fleet.add("rebalance-a")
        wait = _settle([a], partitions, quiet_s=1.0, timeout=ctx.timeout, ready=lambda: _consumed(a) >= records)

        def snapshot() -> dict[str, int]:
            return {w.name: _consumed(w) for w in fleet.workers if w.is_running()}

        def event(
            name: str, before: dict[str, int], after: dict[str, int], since: float, settle_s: float
        ) -> dict[str, Any]:
            # The topic is static and fully consumed, so every record read after ``since`` is a
            # re-read.  A moved partition is read by its new owner from the offset it was assigned
            # at up to the log end; whatever else was read was read on partitions that did not move.
            starts = _assigned_since(fleet.workers, since)
            moved_reads = sum(data.ends.get(p, 0) - start for p, start in starts.items())
            total_reads = sum(after.get(n, 0) - before.get(n, 0) for n in after)
            return {
                "event": name,
                "partitions_moved": sorted(starts),
                # Records re-read on partitions that stayed with their owner: must be 0.
                "reconsumed_kept": total_reads - moved_reads,
                # Records the new owners read of the moved partitions (the old owner's unpublished
                # buffer, dropped on revoke, is read again from the stored offset).
                "reconsumed_moved": moved_reads,
                "buffered_records_dropped": _dropped_since(fleet.workers, since),
                # From the change (launch, join, SIGTERM) until every partition is held again and
                # no consumed counter moved for 2 s.
                "settle_s": settle_s,
            }

        ctx.log(f"[rebalance] worker a consumed all {records} records ({wait:.1f} s); adding worker b")
        before = snapshot()
        since = time.time()
        b = fleet.add("rebalance-b")

        def b_caught_up() -> bool:
            # b must have read its new partition to the log end: a fetch that starts later than
            # the quiet window would otherwise be counted against the next event.
            starts = _assigned_since([b], since)
            due = sum(data.ends.get(p, 0) - start for p, start in starts.items())
            return _assigned(b) > 0 and bool(starts) and _consumed(b) >= due

        settle = _settle(fleet.workers, partitions, quiet_s=2.0, timeout=ctx.timeout, ready=b_caught_up)
        after = snapshot()
        events.append(event("scale-up 1->2", before, after, since, settle))

        ctx.log("[rebalance] a plain consumer joins the group and leaves (nothing should move)")
        before = after
        since = time.time()
        member = GroupMember(ctx.bootstrap, f"ingest-{source}", topic, ctx.timeout).start()
        try:
            joined = _settle(
                fleet.workers,
                partitions,
                quiet_s=2.0,
                timeout=ctx.timeout,
                ready=lambda: member.assigned is not None and _rebalanced_since(fleet.workers, since),
            )
        finally:
            left_at = time.time()
            member.leave()
        left = _settle(
            fleet.workers,
            partitions,
            quiet_s=2.0,
            timeout=ctx.timeout,
            ready=lambda: _rebalanced_since(fleet.workers, left_at),
        )
        after = snapshot()
        ev = event("member joins and leaves (no partition moves)", before, after, since, joined + left)
        ev["member_assigned"] = member.assigned
        ev["member_received"] = member.received
        events.append(ev)

        ctx.log(f"[rebalance] stopping {b.name} (it drains, then its partition moves to {a.name})")
        before = after
        final_b = before[b.name]
        since = time.time()
        b.stop()
        settle = _settle([a], partitions, quiet_s=2.0, timeout=ctx.timeout)
        after = {**snapshot(), b.name: final_b}
        # b published what it held before leaving: a starts b's partition at the log end.
        events.append(event("scale-down 2->1 (after drain)", before, after, since, settle))
        totals = after
    finally:
        fleet.stop()
    consumed_total = sum(totals.values())
    return {
        "topic": topic,
        "partitions": partitions,
        "records": records,
        "events": events,
        "consumed_by_worker": totals,
        "consumed_total": consumed_total,
        "reconsumed_total": consumed_total - records,
        "exactly_once": verify(ctx, source, topic, data.ends),
    }
