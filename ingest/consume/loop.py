"""The consumer loop: poll, route records into per-partition buffers, seal, hand sealed
splits to the pipeline, and pause partitions for backpressure. Everything else it drives
lives in a module of its own: outcomes (ingest.consume.outcomes), repositioning and rewinds
(ingest.consume.positioning), offset gaps (ingest.consume.gaps), operators' controls (ingest.consume.controls),
gauges (ingest.consume.loop_metrics) and the metastore calls, which run in the background
(ingest.consume.background).

Every consumer call happens on this thread. ``poll()`` is never blocked for long: when the
pipeline is full the partitions are paused instead, so the group session and
max.poll.interval.ms stay healthy however slow Spark or PostgreSQL are; and the metastore is
only ever waited for inside a rebalance callback (bounded by its deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import structlog

from ingest.consume.assignment import OwnedPartition
from ingest.consume.context import LoopContext
from ingest.consume.controls import Controls
from ingest.consume.gaps import GapResolver
from ingest.consume.group_offsets import GroupOffsets
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.kafka import Batch, Message, Watermarks
from ingest.consume.loop_metrics import LoopGauges
from ingest.consume.outcomes import UNHEALTHY_AFTER_FAILED_SPLITS, OutcomeHandler
from ingest.consume.positioning import Positioner
from ingest.consume.publish_watch import UNHEALTHY_AFTER_PUBLISH_STALL_S, PublishWatch
from ingest.consume.rebalance import RebalanceHandler
from ingest.consume.registry_watch import RegistryWatch
from ingest.errors import WorkerFailed
from ingest.publish.pipeline import Pipeline
from ingest.splits.chunks import Chunk, chunks_of
from ingest_common.model import DesiredState, WorkerState

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LoopOptions:
    batch_size: int = 2000
    poll_timeout_s: float = 0.1
    drain_timeout_s: float = 60.0
    unhealthy_after_failed_splits: int = UNHEALTHY_AFTER_FAILED_SPLITS
    unhealthy_after_publish_stall_s: float = UNHEALTHY_AFTER_PUBLISH_STALL_S


class ConsumeLoop:
    def __init__(
        self,
        ctx: LoopContext,
        *,
        pipeline: Pipeline,
        handler: RebalanceHandler,
        registry: WorkerRegistry,
        watermarks: Watermarks,
        group_offsets: GroupOffsets | None = None,
        options: LoopOptions = LoopOptions(),
    ) -> None:
        self._ctx = ctx
        self._consumer = ctx.consumer
        self._specs = ctx.specs
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._assignment = ctx.assignment
        self._background = ctx.background
        self._clock = ctx.clock
        self._pipeline = pipeline
        self._handler = handler
        self._registry = registry
        self._group_offsets = group_offsets
        self._options = options
        self._positioner = Positioner(ctx)
        self._gaps = GapResolver(ctx, watermarks=watermarks, positioner=self._positioner, registry=registry)
        self._outcomes = OutcomeHandler(
            ctx,
            positioner=self._positioner,
            registry=registry,
            group_offsets=group_offsets,
            unhealthy_after=options.unhealthy_after_failed_splits,
        )
        self._controls = Controls(ctx, positioner=self._positioner, registry=registry)
        self._gauges = LoopGauges(ctx, pipeline)
        self._registry_watch = RegistryWatch(ctx, pipeline, registry)
        self._publish_watch = PublishWatch(
            pipeline, source=ctx.source, worker_id=ctx.worker_id, bound_s=options.unhealthy_after_publish_stall_s
        )
        metrics = ctx.metrics
        self._m_consumed = metrics.records_consumed.labels(self._source)
        self._m_bytes = metrics.bytes_consumed.labels(self._source)
        self._m_kafka_errors = metrics.kafka_errors.labels(self._source)
        # Only a worker that was consuming when a drain began exits after it; one started
        # while the drain is pending waits, idle, for `ingest resume` (a new release's pods).
        self._ran = False
        # Real time, whatever the clock: the health endpoint compares them with its own.
        self.started_at = time.monotonic()
        # Read by the health endpoint from another thread: a float store is atomic.
        self.last_step_at = self.started_at

    # -- driving -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set (or a drain without ``--stay`` completed), then publish
        what is held (bounded by the drain timeout)."""
        while not stop.is_set():
            self.step()
            if self.state is WorkerState.DRAINED and (
                self._registry.desired_state.terminal or (self._ran and not self._registry.drain_stay)
            ):
                log.info("worker_exiting_after_drain", source=self._source, worker=self._worker_id)
                break
        self.drain()

    def step(self) -> None:
        self.last_step_at = time.monotonic()
        # Everything that may reposition a partition runs before the poll, never between a
        # poll and the routing of its records: records fetched before a seek would otherwise
        # land in the buffer that starts at the new position.
        self._background.apply_done()
        self._controls.hold_changed()
        holding = self._controls.holding
        batch = self._consumer.poll(self._options.batch_size, self._options.poll_timeout_s)
        self._raise_callback_error()
        now = self._clock.monotonic()
        if not holding:
            # While holding, deliveries (fetched before the pause took effect) are not buffered:
            # the buffers were sealed at their positions, and resuming seeks back to them.
            self._take(batch, now)
            self._ran = True
        self._seal_due(now, holding)
        self._outcomes.handle(self._pipeline.poll(), draining=False)
        self._publish_watch.check()
        self._registry_watch.check()
        if self._group_offsets is not None:
            self._group_offsets.commit_due(self._consumer, set(self._assignment.tps()), now)
        self._positioner.rewinds_due(now)
        self._gaps.due(now)
        self._apply_backpressure(holding)
        state = self.state
        self._gauges.update(state, now)
        self._registry.beat(
            state,
            [str(tp) for tp in self._assignment.tps()],
            registry_waiting=self._registry_watch.reported(),
            registry_error=self._registry_watch.error,
        )
        self._controls.apply(now)

    def drain(self) -> bool:
        """Seal every buffer and wait (still polling, partitions paused) until the pipeline
        is empty. Returns False if the drain timeout ran out first."""
        now = self._clock.monotonic()
        for owned in self._assignment:
            if owned.active and len(owned.buffer):
                self._seal(owned, "shutdown", now)
        self._consumer.set_paused(self._assignment.tps())
        self._registry.beat(WorkerState.DRAINING, [str(tp) for tp in self._assignment.tps()], force=True)
        # A bound on real work (builds, publishes): real time, whatever the clock.
        deadline = time.monotonic() + self._options.drain_timeout_s
        while self._pipeline.inflight_count and time.monotonic() < deadline:
            # Paused: this returns nothing new but keeps the group session alive.
            self._consumer.poll(self._options.batch_size, self._options.poll_timeout_s)
            self._raise_callback_error()
            self._background.apply_done()
            self._outcomes.handle(self._pipeline.poll(), draining=True)
        self._outcomes.handle(self._pipeline.poll(), draining=True)
        if self._group_offsets is not None:
            self._group_offsets.commit_due(self._consumer, set(self._assignment.tps()), float("inf"))
        drained = self._pipeline.inflight_count == 0
        log.info(
            "worker_drained" if drained else "worker_drain_timeout",
            source=self._source,
            worker=self._worker_id,
            inflight=self._pipeline.inflight_count,
        )
        return drained

    # -- what the worker reports -----------------------------------------------------

    @property
    def unhealthy_reason(self) -> str | None:
        """Splits failing in a row: the worker's registry state too (``state``)."""
        return self._outcomes.unhealthy_reason

    @property
    def publish_stall(self) -> str | None:
        """A publish unfinished past its bound (ingest.consume.publish_watch): /healthz only."""
        return self._publish_watch.stalled_reason

    @property
    def registry_wait(self) -> str | None:
        """Partitions paused while the schema registry does not answer: /readyz only (the
        worker is healthy; ingest.consume.registry_watch)."""
        return self._registry_watch.reason

    @property
    def state(self) -> WorkerState:
        desired = self._registry.desired_state
        if desired is DesiredState.RUNNING:
            return WorkerState.UNHEALTHY if self.unhealthy_reason is not None else WorkerState.RUNNING
        empty = self._pipeline.inflight_count == 0 and self._assignment.buffered_records() == 0
        if desired.ends_workers:
            return WorkerState.DRAINED if empty else WorkerState.DRAINING
        return WorkerState.SUSPENDED if empty else WorkerState.SUSPENDING

    # -- records -------------------------------------------------------------------

    def _take(self, batch: Batch, now: float) -> None:
        for name, text in batch.errors:
            self._m_kafka_errors.inc()
            log.warning("kafka_error", source=self._source, worker=self._worker_id, code=name, error=text)
        for tp, offset, text in batch.refused:
            self._m_kafka_errors.inc()
            self._gaps.refused(tp, offset, text)
        for tp, truncation, text in batch.truncated:
            self._m_kafka_errors.inc()
            self._gaps.refused(tp, truncation.offset, text, truncation)
        if batch.records:
            self._route(batch.records, now)
        # After the records: an end of partition says every offset before it was delivered, and
        # records of the same poll may precede it. Applied first, it would stretch a split sealed
        # mid-batch over records that then fall before the next buffer's start and are dropped.
        for tp, offset in batch.ends:
            # The current split may cover the offsets past its last record that carry none
            # (transaction markers, aborted records).
            owned = self._assignment.get(tp)
            if owned is not None and owned.active:
                owned.buffer.delivered_to(offset)

    def _route(self, records: Sequence[Message], now: float) -> None:
        """Each partition's records of the poll become chunks at once (the messages are not
        kept past this step), taken by the partition's buffer, sealed where it fills."""
        limits = self._specs.spec.split
        lookup = self._assignment.lookup
        consumed = 0
        consumed_bytes = 0
        for topic, partition, run in partition_runs(records):
            owned = lookup(topic, partition)
            if owned is None or not owned.active:
                continue  # fetched before a revoke, fence or rewind: never buffered
            for chunk in chunks_of(run):
                rest: Chunk | None = chunk
                while rest is not None:
                    rest, added, added_bytes = owned.buffer.take(rest, now, limits)
                    consumed += added
                    consumed_bytes += added_bytes
                    if reason := owned.buffer.full(limits):
                        self._seal(owned, reason, now)
        self._m_consumed.inc(consumed)
        self._m_bytes.inc(consumed_bytes)

    def _seal_due(self, now: float, holding: bool) -> None:
        for owned in self._assignment:
            if not owned.active:
                continue
            if reason := owned.buffer.should_seal(self._specs.spec.split, now):
                self._seal(owned, reason, now)
            elif holding and len(owned.buffer):
                self._seal(owned, self._registry.desired_state, now)

    def _seal(self, owned: OwnedPartition, reason: str, now: float) -> None:
        split = owned.buffer.seal(reason, now)
        log.info(
            "split_sealed",
            source=self._source,
            topic=split.tp.topic,
            partition=split.tp.partition,
            start=split.start,
            end=split.end,
            records=len(split),
            bytes=split.size_bytes,
            reason=reason,
        )
        self._pipeline.submit(split)

    def _raise_callback_error(self) -> None:
        if self._handler.error is not None:
            raise WorkerFailed(f"rebalance failed: {self._handler.error}") from self._handler.error

    def _apply_backpressure(self, holding: bool) -> None:
        limits = self._specs.spec.split
        held = self._pipeline.inflight_bytes + self._assignment.buffered_bytes()
        full = self._pipeline.inflight_count >= limits.max_in_flight or held >= limits.max_in_flight_bytes or holding
        # A partition whose split waits for the schema registry reads nothing more meanwhile.
        waiting = self._registry_watch.partitions
        self._consumer.set_paused(o.tp for o in self._assignment if full or not o.active or o.tp in waiting)


def partition_runs(records: Sequence[Message]) -> list[tuple[str, int, Sequence[Message]]]:
    """A poll's records as (topic, partition, its records in the order delivered), one entry
    per partition. librdkafka hands out each fetched partition's records together, so a
    partition's records are usually one run of the batch; one found in several runs is
    gathered (a stable sort: its records stay in order)."""
    n = len(records)
    if not n:
        return []
    topics = [r.topic() for r in records]
    partitions = [r.partition() for r in records]
    if topics.count(topics[0]) == n:
        keys = np.array(partitions, dtype=np.int64)
    else:
        numbers: dict[tuple[str, int], int] = {}
        keys = np.array(
            [numbers.setdefault(tp, len(numbers)) for tp in zip(topics, partitions, strict=True)], dtype=np.int64
        )
    starts = _starts(keys)
    if len(set(keys[starts].tolist())) < len(starts):
        order = np.argsort(keys, kind="stable").tolist()
        records = [records[i] for i in order]
        topics = [topics[i] for i in order]
        partitions = [partitions[i] for i in order]
        starts = _starts(keys[order])
    ends = [*starts[1:], n]
    return [(topics[lo], partitions[lo], records[lo:hi]) for lo, hi in zip(starts, ends, strict=True)]


def _starts(keys: npt.NDArray[np.int64]) -> list[int]:
    """Where each run of equal keys starts."""
    return [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()]
