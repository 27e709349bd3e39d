"""The consumer loop: serve the group's callbacks, learn where each owned partition's log
ends, cut splits from offsets and hand each to the build stage and the publish stage, and hold
back for backpressure. Everything else it drives lives in a module of its own: log ends
(ingest.consume.log_ends), cuts (ingest.consume.cutter), outcomes (ingest.consume.outcomes),
repositioning and rewinds (ingest.consume.positioning), offset gaps (ingest.consume.gaps),
operators' controls (ingest.consume.controls), gauges (ingest.consume.loop_metrics) and the
metastore calls, which run in the background (ingest.consume.background).

No record passes through this process: Spark reads each split's offsets from Kafka
(ingest.builder.kafka_read). Every consumer call happens on this thread, and ``poll()`` is never
blocked for long: when too much is in flight the loop cuts nothing more, so the group session
and max.poll.interval.ms stay healthy however slow Spark or PostgreSQL are; and the metastore is
only ever waited for inside a rebalance callback (bounded by its deadline).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import structlog

from ingest.builder.queue import BuildQueue
from ingest.consume.assignment import OwnedPartition
from ingest.consume.build_watch import BuildWatch
from ingest.consume.context import LoopContext
from ingest.consume.controls import Controls
from ingest.consume.gaps import GapResolver
from ingest.consume.group_offsets import GroupOffsets
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.kafka import Batch
from ingest.consume.log_ends import LOG_END_INTERVAL_S, LogEnds
from ingest.consume.log_offsets import LogOffsets
from ingest.consume.loop_metrics import LoopGauges
from ingest.consume.outcomes import UNHEALTHY_AFTER_FAILED_SPLITS, OutcomeHandler
from ingest.consume.positioning import Positioner
from ingest.consume.publish_watch import UNHEALTHY_AFTER_PUBLISH_STALL_S, PublishWatch
from ingest.consume.rebalance import RebalanceHandler
from ingest.consume.registry_watch import RegistryWatch
from ingest.errors import WorkerFailed
from ingest.publish.queue import PublishQueue
from ingest_common.model import DesiredState, TopicPartition, WorkerState

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LoopOptions:
    poll_timeout_s: float = 0.1
    log_end_interval_s: float = LOG_END_INTERVAL_S
    drain_timeout_s: float = 60.0
    unhealthy_after_failed_splits: int = UNHEALTHY_AFTER_FAILED_SPLITS
    unhealthy_after_publish_stall_s: float = UNHEALTHY_AFTER_PUBLISH_STALL_S
    # A batch still building this long past its start makes the worker unhealthy (the build's
    # own deadline interrupts it first: ingest.builder.job).
    unhealthy_after_build_s: float = 900.0


class ConsumeLoop:
    def __init__(
        self,
        ctx: LoopContext,
        *,
        builds: BuildQueue,
        publishes: PublishQueue,
        handler: RebalanceHandler,
        registry: WorkerRegistry,
        offsets: LogOffsets,
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
        self._builds = builds
        self._publishes = publishes
        self._handler = handler
        self._registry = registry
        self._group_offsets = group_offsets
        self._options = options
        self._positioner = Positioner(ctx)
        self._gaps = GapResolver(ctx, watermarks=offsets, positioner=self._positioner, registry=registry)
        self._log_ends = LogEnds(ctx, offsets, self._gaps, interval_s=options.log_end_interval_s)
        self._outcomes = OutcomeHandler(
            ctx,
            positioner=self._positioner,
            registry=registry,
            group_offsets=group_offsets,
            unhealthy_after=options.unhealthy_after_failed_splits,
        )
        self._controls = Controls(ctx, positioner=self._positioner, registry=registry)
        self._gauges = LoopGauges(ctx, publishes, self._log_ends)
        self._registry_watch = RegistryWatch(ctx, builds, registry)
        self._publish_watch = PublishWatch(
            publishes, source=ctx.source, worker_id=ctx.worker_id, bound_s=options.unhealthy_after_publish_stall_s
        )
        self._build_watch = BuildWatch(
            builds, source=ctx.source, worker_id=ctx.worker_id, bound_s=options.unhealthy_after_build_s
        )
        metrics = ctx.metrics
        self._m_dropped = metrics.records_fetched_by_worker.labels(self._source)
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
        # Everything that may reposition a partition runs before the cuts of this step.
        self._background.apply_done()
        held = self._controls.hold_changed()
        holding = self._controls.holding
        batch = self._consumer.poll(self._options.poll_timeout_s)
        self._raise_callback_error()
        now = self._clock.monotonic()
        self._events(batch)
        self._log_ends.step(now)
        # Outcomes before cuts: a refusal or failure repositions first, a publish teaches the
        # partition's bytes per offset.
        self._outcomes.handle(self._publishes.poll(), draining=False)
        if held is not None:
            # A hold (suspend, drain) publishes what was in the log when it began: the cutters
            # take no later log end until it ends.
            self._log_ends.hold(held)
        if not holding:
            self._cut_due(now)
            self._ran = True
        else:
            self._cut_due(now, until_empty=str(self._registry.desired_state))
        self._publish_watch.check()
        self._build_watch.check()
        self._registry_watch.check()
        if self._group_offsets is not None:
            self._group_offsets.commit_due(self._consumer, set(self._assignment.tps()), now)
        self._positioner.rewinds_due(now)
        self._gaps.due(now)
        if (topics := self._handler.topics) is not None:
            topics.due(now)
        state = self.state
        self._gauges.update(state, now, cutting=self._cutting(holding))
        self._registry.beat(
            state,
            [str(tp) for tp in self._assignment.tps()],
            registry_waiting=self._registry_watch.reported(),
            registry_error=self._registry_watch.error,
        )
        self._controls.apply(now)

    def drain(self) -> bool:
        """Cut nothing more and wait (still polling) until every split in flight is resolved.
        Returns False if the drain timeout ran out first."""
        self._registry.beat(WorkerState.DRAINING, [str(tp) for tp in self._assignment.tps()], force=True)
        # A bound on real work (builds, publishes): real time, whatever the clock.
        deadline = time.monotonic() + self._options.drain_timeout_s
        while self._publishes.inflight_count and time.monotonic() < deadline:
            # Keeps the group session alive.
            self._consumer.poll(self._options.poll_timeout_s)
            self._raise_callback_error()
            self._background.apply_done()
            self._outcomes.handle(self._publishes.poll(), draining=True)
        self._outcomes.handle(self._publishes.poll(), draining=True)
        if self._group_offsets is not None:
            self._group_offsets.commit_due(self._consumer, set(self._assignment.tps()), float("inf"))
        drained = self._publishes.inflight_count == 0
        log.info(
            "worker_drained" if drained else "worker_drain_timeout",
            source=self._source,
            worker=self._worker_id,
            inflight=self._publishes.inflight_count,
        )
        return drained

    # -- what the worker reports -----------------------------------------------------

    @property
    def unhealthy_reason(self) -> str | None:
        """Splits failing in a row: the worker's registry state too (``state``)."""
        return self._outcomes.unhealthy_reason

    @property
    def publish_stall(self) -> str | None:
        """A publish unfinished past its bound (ingest.consume.publish_watch), or a build
        running past its (ingest.consume.build_watch): /healthz only."""
        return self._publish_watch.stalled_reason or self._build_watch.stalled_reason

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
        empty = self._publishes.inflight_count == 0 and not any(
            o.active and o.cutter.available() for o in self._assignment
        )
        if desired.ends_workers:
            return WorkerState.DRAINED if empty else WorkerState.DRAINING
        return WorkerState.SUSPENDED if empty else WorkerState.SUSPENDING

    # -- splits --------------------------------------------------------------------

    def _events(self, batch: Batch) -> None:
        for name, text in batch.errors:
            self._m_kafka_errors.inc()
            log.warning("kafka_error", source=self._source, worker=self._worker_id, code=name, error=text)
        for tp, offset, text in batch.refused:
            self._m_kafka_errors.inc()
            self._gaps.refused(tp, offset, text)
        for tp, truncation, text in batch.truncated:
            self._m_kafka_errors.inc()
            self._gaps.refused(tp, truncation.offset, text, truncation)
        if batch.records_dropped:
            self._m_dropped.inc(batch.records_dropped)

    def _cut_due(self, now: float, *, until_empty: str | None = None) -> None:
        """Cut every split that is due, one per partition per round (so that a backlog on one
        partition does not take every place in flight), until nothing is due or too much is
        in flight. A partition whose split waits for the schema registry cuts nothing meanwhile,
        nor one whose first split is still in flight (its size estimate is a guess till then).
        ``until_empty``: cut whatever is available, due or not, with this reason (a hold begins)."""
        limits = self._specs.spec.split
        waiting = self._registry_watch.partitions
        candidates = [o for o in self._assignment if o.active and o.tp not in waiting]
        while candidates and not self._full():
            cut_any = []
            for owned in candidates:
                if self._full():
                    return
                if not owned.size.learned and owned.tp in self._publishes.inflight_partitions():
                    # Its bytes per offset are a guess until its first split is built: one
                    # split is cut on it, no more.
                    continue
                reason = owned.cutter.due(limits, owned.size, now)
                if reason is None and until_empty is not None and owned.cutter.validated and owned.cutter.available():
                    reason = until_empty
                if reason is not None:
                    self._cut(owned, reason, now)
                    cut_any.append(owned)
            candidates = cut_any

    def _cutting(self, holding: bool) -> frozenset[TopicPartition]:
        """The partitions a split may be cut from now."""
        if holding or self._full():
            return frozenset()
        waiting = self._registry_watch.partitions
        return frozenset(o.tp for o in self._assignment if o.active and o.tp not in waiting)

    def _full(self) -> bool:
        limits = self._specs.spec.split
        publishes = self._publishes
        return (
            publishes.inflight_count >= limits.max_in_flight or publishes.inflight_bytes >= limits.max_in_flight_bytes
        )

    def _cut(self, owned: OwnedPartition, reason: str, now: float) -> None:
        spec, version = self._specs.current()
        split = owned.cutter.cut(reason, spec.split, owned.size, now)
        log.info(
            "split_sealed",
            source=self._source,
            topic=split.tp.topic,
            partition=split.tp.partition,
            start=split.start,
            end=split.end,
            estimated_bytes=split.estimated_bytes,
            reason=reason,
        )
        self._publishes.submit(split, self._builds.submit(split, spec), version)

    def _raise_callback_error(self) -> None:
        if self._handler.error is not None:
            raise WorkerFailed(f"rebalance failed: {self._handler.error}") from self._handler.error
