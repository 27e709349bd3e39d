"""The consumer loop: poll, route records into per-partition buffers, seal, hand sealed
splits to the pipeline, act on their outcomes, and pause partitions for backpressure.

Every consumer call happens on this thread. ``poll()`` is never blocked for long: when
the pipeline is full the partitions are paused instead, so the group session and
max.poll.interval.ms stay healthy however slow Spark or PostgreSQL are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.assignment import Assignment, OwnedPartition, PartitionStatus
from ingest.errors import WorkerFailed
from ingest.group_offsets import GroupOffsets
from ingest.metrics import Metrics
from ingest.pipeline import Conflicted, Failed, Fatal, Killed, Outcome, Pipeline, Published
from ingest.rebalance import RebalanceHandler, start_offset
from ingest.registry import WorkerRegistry
from ingest.spec import SourceSpec
from ingest_common.model import (
    ConflictReason,
    DesiredState,
    GapAction,
    KillReason,
    PartitionClaim,
    TopicPartition,
    WorkerState,
)
from metastore.errors import MetastoreError, PublishConflict

log = structlog.get_logger(__name__)

_REWIND_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# Default of splits that failed (each after its build retries) in a row, with no publish in
# between, before the worker reports itself unhealthy: a broken Spark session or an unwritable
# store does not heal by rewinding, and an orchestrator restarts a worker whose /healthz fails.
UNHEALTHY_AFTER_FAILED_SPLITS = 5


class OffsetStore(Protocol):
    def partition_state(self, source: str, tp: TopicPartition) -> tuple[int, int | None] | None: ...
    def reclaim_partitions(
        self, source: str, worker: str, held: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, PartitionClaim]: ...
    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]: ...
    def record_gap(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None: ...
    def skip_gap(
        self, source: str, worker: str, tp: TopicPartition, serial: int, from_offset: int, to_offset: int
    ) -> int: ...


class ConsumeLoop:
    def __init__(
        self,
        *,
        consumer: Any,
        spec: SourceSpec,
        worker_id: str,
        assignment: Assignment,
        pipeline: Pipeline,
        handler: RebalanceHandler,
        store: OffsetStore,
        registry: WorkerRegistry,
        metrics: Metrics,
        batch_size: int = 2000,
        poll_timeout_s: float = 0.1,
        drain_timeout_s: float = 60.0,
        spec_version: int = 0,
        unhealthy_after_failed_splits: int = UNHEALTHY_AFTER_FAILED_SPLITS,
        group_offsets: GroupOffsets | None = None,
    ) -> None:
        self._consumer = consumer
        self._spec = spec
        self._source = spec.name
        self._worker_id = worker_id
        self._assignment = assignment
        self._pipeline = pipeline
        self._handler = handler
        self._store = store
        self._registry = registry
        self._metrics = metrics
        self._group_offsets = group_offsets
        self._batch_size = batch_size
        self._poll_timeout_s = poll_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._lag_due = 0.0
        # Failed splits since the last publish, and the last failure (the cause reported).
        self._failed_streak = 0
        self._last_failure = ""
        self._unhealthy_after = unhealthy_after_failed_splits
        # Only a worker that was consuming when a drain began exits after it; one started
        # while the drain is pending waits, idle, for `ingest resume` (a new release's pods).
        self._ran = False
        self._was_holding = False
        self.started_at = time.monotonic()
        # Read by the health endpoint from another thread: a float store is atomic.
        self.last_step_at = self.started_at
        self._m_consumed = metrics.records_consumed.labels(self._source)
        self._m_bytes = metrics.bytes_consumed.labels(self._source)
        self._spec_version = spec_version
        # The reset generation already acted on (None: not known yet; the first one seen
        # triggers a harmless re-claim check).
        control = registry.control
        self._reset_generation: int | None = control.reset_generation if control is not None else None
        self._controls_retry_at = 0.0

    # -- driving -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set (or a drain without ``--stay`` completed), then publish
        what is held (bounded by the drain timeout)."""
        while not stop.is_set():
            self.step()
            terminating = self._registry.desired_state.terminal
            if self.state is WorkerState.DRAINED and (terminating or (self._ran and not self._registry.drain_stay)):
                log.info("worker_exiting_after_drain", source=self._source, worker=self._worker_id)
                break
        self.drain()

    @property
    def unhealthy_reason(self) -> str | None:
        """Why the worker should be restarted, or None. Offsets never advance past a failed
        split (it is rewound and re-read), so this only surfaces a worker that makes no progress."""
        if self._failed_streak < self._unhealthy_after:
            return None
        return f"{self._failed_streak} splits failed in a row, none published since; last: {self._last_failure}"

    @property
    def holding(self) -> bool:
        """Suspended or draining: publish what is held, take nothing new."""
        return self._registry.desired_state.holding

    @property
    def state(self) -> WorkerState:
        desired = self._registry.desired_state
        if desired is DesiredState.RUNNING:
            return WorkerState.UNHEALTHY if self.unhealthy_reason is not None else WorkerState.RUNNING
        empty = self._pipeline.inflight_count == 0 and not any(len(o.buffer) for o in self._assignment)
        if desired.ends_workers:
            return WorkerState.DRAINED if empty else WorkerState.DRAINING
        return WorkerState.SUSPENDED if empty else WorkerState.SUSPENDING

    def step(self) -> None:
        self.last_step_at = time.monotonic()
        messages = self._consumer.consume(self._batch_size, self._poll_timeout_s)
        self._raise_callback_error()
        now = time.monotonic()
        holding = self.holding
        if holding != self._was_holding:
            self._was_holding = holding
            if not holding:
                self._resume_positions()
        if messages and not holding:
            self._route(messages, now)
        # While holding, deliveries (fetched before the pause took effect) are not buffered:
        # the buffers were sealed at their positions, and resuming seeks back to them.
        self._ran = self._ran or not holding
        for owned in self._assignment:
            if owned.status is not PartitionStatus.ACTIVE:
                continue
            if reason := owned.buffer.should_seal(self._spec.split, now):
                self._seal(owned, reason, now)
            elif holding and len(owned.buffer):
                self._seal(owned, self._registry.desired_state, now)
        self._handle(self._pipeline.poll(), draining=False)
        self._commit_group_offsets(now)
        self._rewind_due(now)
        self._gaps_due(now)
        self._apply_backpressure()
        self._update_gauges()
        if now >= self._lag_due:
            self._lag_due = now + 1.0
            self._update_lag()
        self._registry.beat(self.state, [str(tp) for tp in self._assignment.tps()])
        self._apply_controls(now)

    def drain(self) -> bool:
        """Seal every buffer and wait (still polling, partitions paused) until the pipeline
        is empty. Returns False if the drain timeout ran out first."""
        now = time.monotonic()
        for owned in self._assignment:
            if owned.status is PartitionStatus.ACTIVE and len(owned.buffer):
                self._seal(owned, "shutdown", now)
        self._pause(set(self._assignment.tps()))
        self._registry.beat(WorkerState.DRAINING, [str(tp) for tp in self._assignment.tps()], force=True)
        deadline = now + self._drain_timeout_s
        while self._pipeline.inflight_count and time.monotonic() < deadline:
            # Paused: this returns nothing new but keeps the group session alive.
            self._consumer.consume(self._batch_size, self._poll_timeout_s)
            self._raise_callback_error()
            self._handle(self._pipeline.poll(), draining=True)
        self._handle(self._pipeline.poll(), draining=True)
        self._commit_group_offsets(float("inf"))
        drained = self._pipeline.inflight_count == 0
        log.info(
            "worker_drained" if drained else "worker_drain_timeout",
            source=self._source,
            worker=self._worker_id,
            inflight=self._pipeline.inflight_count,
        )
        return drained

    # -- records -------------------------------------------------------------------

    def _route(self, messages: list[Any], now: float) -> None:
        limits = self._spec.split
        consumed = 0
        consumed_bytes = 0
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._end_of_partition(msg)
                else:
                    self._kafka_error(msg, err)
                continue
            owned = self._assignment.get(msg.topic(), msg.partition())
            if owned is None or owned.status is not PartitionStatus.ACTIVE:
                continue  # fetched before a revoke, fence or rewind: never buffered
            size = len(msg)
            buffer = owned.buffer
            if buffer.append(msg, size, now):
                consumed += 1
                consumed_bytes += size
                if len(buffer) >= limits.max_records or buffer.size_bytes >= limits.max_bytes:
                    self._seal(owned, "records" if len(buffer) >= limits.max_records else "bytes", now)
        self._m_consumed.inc(consumed)
        self._m_bytes.inc(consumed_bytes)

    def _end_of_partition(self, msg: Any) -> None:
        """Everything before the EOF's offset was delivered: the current split may cover the
        offsets past its last record that carry none (transaction markers, aborted records)."""
        owned = self._assignment.get(msg.topic(), msg.partition())
        if owned is not None and owned.status is PartitionStatus.ACTIVE and msg.offset() is not None:
            owned.buffer.delivered_to(msg.offset())

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

    def _kafka_error(self, msg: Any, err: Any) -> None:
        self._metrics.kafka_errors.labels(self._source).inc()
        if err.fatal():
            raise WorkerFailed(f"fatal Kafka error: {err.str()}")
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            owned = self._assignment.get(msg.topic(), msg.partition())
            if owned is not None and owned.status is PartitionStatus.ACTIVE:
                # Stop the partition first: nothing of it is buffered or published until the
                # gap is measured against the stored offset and recorded.
                owned.status = PartitionStatus.OUT_OF_RANGE
                owned.reset_buffer(None)
                owned.refused_offset = msg.offset()
                owned.gap_pending = True
                owned.retry_at = 0.0
                self._pipeline.kill([owned.tp], KillReason.OUT_OF_RANGE)
                log.warning(
                    "offset_refused",
                    source=self._source,
                    worker=self._worker_id,
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=msg.offset(),
                    error=err.str(),
                )
                self._resolve_gap(owned, time.monotonic())
            return
        log.warning("kafka_error", source=self._source, worker=self._worker_id, code=err.name(), error=err.str())

    def _raise_callback_error(self) -> None:
        if self._handler.error is not None:
            raise WorkerFailed(f"rebalance failed: {self._handler.error}") from self._handler.error

    # -- outcomes ------------------------------------------------------------------

    def _handle(self, outcomes: list[Outcome], *, draining: bool) -> None:
        for outcome in outcomes:
            split = outcome.split
            owned = self._assignment.get(split.tp.topic, split.tp.partition)
            current = owned is not None and owned.claim.serial == split.serial and owned.epoch == split.epoch
            fields = {
                "source": self._source,
                "topic": split.tp.topic,
                "partition": split.tp.partition,
                "start": split.start,
                "end": split.end,
                "split": str(split.id),
            }
            if isinstance(outcome, Published):
                self._published(outcome, owned if current else None, fields)
            elif isinstance(outcome, Killed):
                self._metrics.splits_killed.labels(self._source, outcome.reason).inc()
                log.info("split_killed", reason=outcome.reason, **fields)
            elif isinstance(outcome, Conflicted):
                reason = outcome.conflict.reason
                self._metrics.publish_conflicts.labels(self._source, reason).inc()
                self._registry.error("PUBLISH_CONFLICT", str(outcome.conflict))
                log.warning(
                    "publish_rejected",
                    reason=reason,
                    expected=outcome.conflict.expected,
                    stored=outcome.conflict.actual,
                    **fields,
                )
                if current and owned is not None and not draining:
                    if reason == ConflictReason.SERIAL:
                        owned.status = PartitionStatus.FENCED
                        owned.reset_buffer(None)
                        log.warning("partition_fenced", **fields)
                    else:
                        self._schedule_rewind(owned)
            elif isinstance(outcome, Failed):
                self._metrics.split_failures.labels(self._source, outcome.stage).inc()
                self._failed_streak += 1
                self._last_failure = f"{outcome.stage} of {split.tp} [{split.start}, {split.end}): {outcome.error}"
                if self._failed_streak == self._unhealthy_after:
                    log.error(
                        "worker_unhealthy", source=self._source, worker=self._worker_id, reason=self.unhealthy_reason
                    )
                self._registry.error(f"{outcome.stage.upper()}_FAILED", f"{split.tp}: {outcome.error}")
                log.error("split_failed", stage=outcome.stage, error=str(outcome.error), **fields)
                if current and owned is not None and not draining:
                    self._schedule_rewind(owned)
            elif isinstance(outcome, Fatal):
                self._registry.error("PARSE_FAILURE", str(outcome.error))
                raise outcome.error

    def _published(self, outcome: Published, owned: OwnedPartition | None, fields: dict[str, Any]) -> None:
        seg = outcome.segment
        source = self._source
        m = self._metrics
        m.segments_published.labels(source).inc()
        m.records_published.labels(source).inc(seg.row_count)
        m.count_parse_errors(seg)
        m.build_seconds.labels(source).observe(seg.build_seconds)
        m.publish_seconds.labels(source).observe(outcome.publish_seconds)
        m.segment_rows.labels(source).observe(seg.row_count)
        m.segment_bytes.labels(source).observe(seg.size_bytes)
        newest_ms = max((r.timestamp()[1] for r in outcome.split.records[-1:]), default=0)
        if newest_ms > 0:
            m.visible_latency.labels(source).observe(max(0.0, time.time() - newest_ms / 1000))
        self._failed_streak = 0
        if owned is not None:
            owned.published_end = outcome.split.end
            owned.failures = 0
            if self._group_offsets is not None:
                self._group_offsets.published(outcome.split.tp, outcome.split.end)
            m.partition_next_offset.labels(source, outcome.split.tp.topic, str(outcome.split.tp.partition)).set(
                outcome.split.end
            )
        log.info(
            "segment_published",
            segment_id=outcome.segment_id,
            rows=seg.row_count,
            rejects=seg.rejects_count,
            skipped=seg.skipped_count,
            bytes=seg.size_bytes,
            build_s=round(seg.build_seconds, 3),
            publish_ms=round(outcome.publish_seconds * 1000, 2),
            **fields,
        )

    def _commit_group_offsets(self, now: float) -> None:
        if self._group_offsets is not None:
            self._group_offsets.commit_due(self._consumer, set(self._assignment.tps()), now)

    def _resume_positions(self) -> None:
        """After a suspend or drain: continue each partition right after its last sealed split.
        Its buffer is empty (sealed while holding) and already starts at that position."""
        for owned in self._assignment:
            if owned.status is not PartitionStatus.ACTIVE:
                continue
            position = owned.buffer.position
            target = position if position is not None else start_offset(owned.claim)
            try:
                self._seek(owned, target)
            except KafkaException as exc:
                log.warning("resume_seek_failed", source=self._source, partition=str(owned.tp), error=str(exc))
                self._schedule_rewind(owned)
        log.info("consumption_resumed", source=self._source, worker=self._worker_id)

    # -- resets and spec versions ----------------------------------------------------

    def _apply_controls(self, now: float) -> None:
        """Act on a reset (the reset generation moved) or a new spec version, as the last
        heartbeat (or a NOTIFY that triggered it) read them. Retried after a metastore error."""
        control = self._registry.control
        if control is None or now < self._controls_retry_at:
            return
        try:
            if control.reset_generation != self._reset_generation:
                self._reclaim_after_reset()
                self._reset_generation = control.reset_generation
            if control.spec_version != self._spec_version:
                self._load_spec()
        except MetastoreError as exc:
            self._metrics.metastore_errors.labels(self._source).inc()
            self._controls_retry_at = now + 1.0
            log.warning("control_apply_failed", source=self._source, worker=self._worker_id, error=str(exc))

    def _reclaim_after_reset(self) -> None:
        """An ``ingest reset`` bumped the serials of some partitions: everything held for them
        (buffers, in-flight splits) belongs to the old epoch and could only be refused. Claim
        them again (their serial moves once more, fencing anything of ours still in flight),
        drop what is held and seek to the offset the reset stored. Partitions whose serial moved
        because another worker claimed them are not touched (the metastore checks the owner)."""
        held = [(owned.tp, owned.claim.serial) for owned in self._assignment]
        claims = self._store.reclaim_partitions(self._source, self._worker_id, held)
        if not claims:
            log.info("reset_seen", source=self._source, worker=self._worker_id, reclaimed=0)
            return
        killed = self._pipeline.kill(claims, KillReason.RESET)
        for tp, claim in claims.items():
            owned = self._assignment.get(tp.topic, tp.partition)
            if owned is None:
                continue  # revoked meanwhile: the next owner's claim reads the reset offset
            owned.claim = claim
            owned.failures = 0
            owned.published_end = None
            owned.reset_buffer(claim.next_offset)
            owned.status = PartitionStatus.ACTIVE
            try:
                self._seek(owned, start_offset(claim))
            except KafkaException as exc:
                log.warning("reset_seek_failed", source=self._source, partition=str(tp), error=str(exc))
                self._schedule_rewind(owned)
        log.info(
            "partitions_reset",
            source=self._source,
            worker=self._worker_id,
            splits_killed=killed,
            partitions=[f"{c.tp}@{c.next_offset}#{c.serial}" for c in sorted(claims.values(), key=lambda c: c.tp)],
        )

    def _load_spec(self) -> None:
        """A new spec version: splits sealed from now on are built and published with it (split
        limits apply to the open buffers at once). Consumption does not stop. Topics and the
        consumer group are fixed for the life of a worker: changing them needs a restart."""
        version, doc = self._store.latest_spec(self._source)
        spec = SourceSpec.from_json(doc)
        if (spec.topics, spec.group_id) != (self._spec.topics, self._spec.group_id):
            log.warning(
                "spec_change_needs_restart",
                source=self._source,
                worker=self._worker_id,
                spec_version=version,
                topics=list(spec.topics),
                group=spec.group_id,
            )
        self._spec = spec
        self._pipeline.set_spec(spec, version)
        self._registry.spec_version = version
        log.info(
            "spec_version_applied",
            source=self._source,
            worker=self._worker_id,
            spec_version=version,
            previous=self._spec_version,
        )
        self._spec_version = version

    # -- rewinds -------------------------------------------------------------------

    def _schedule_rewind(self, owned: OwnedPartition) -> None:
        """Stop taking records for the partition; ``_rewind_due`` re-seeks it to the stored
        offset once its in-flight splits are dead."""
        backoff = _REWIND_BACKOFF_S[min(owned.failures, len(_REWIND_BACKOFF_S) - 1)]
        owned.failures += 1
        owned.status = PartitionStatus.REWINDING
        owned.retry_at = time.monotonic() + backoff
        owned.reset_buffer(None)
        self._pipeline.kill([owned.tp], KillReason.REWIND)
        log.warning("partition_rewind_scheduled", source=self._source, partition=str(owned.tp), in_s=backoff)

    def _rewind_due(self, now: float) -> None:
        for owned in self._assignment:
            if owned.status is not PartitionStatus.REWINDING or owned.retry_at > now:
                continue
            try:
                state = self._store.partition_state(self._source, owned.tp)
            except MetastoreError as exc:
                self._metrics.metastore_errors.labels(self._source).inc()
                owned.retry_at = now + 1.0
                log.warning("rewind_read_failed", source=self._source, partition=str(owned.tp), error=str(exc))
                continue
            if state is None or state[0] != owned.claim.serial:
                owned.status = PartitionStatus.FENCED
                log.warning(
                    "partition_fenced",
                    source=self._source,
                    partition=str(owned.tp),
                    serial=owned.claim.serial,
                    stored_serial=state[0] if state else None,
                )
                continue
            claim = PartitionClaim(owned.tp, owned.claim.serial, state[1], owned.claim.initial_position)
            target = start_offset(claim)
            try:
                self._seek(owned, target)
            except KafkaException as exc:
                owned.retry_at = now + 1.0
                log.warning("rewind_seek_failed", source=self._source, partition=str(owned.tp), error=str(exc))
                continue
            owned.reset_buffer(state[1])
            owned.status = PartitionStatus.ACTIVE
            log.info("partition_rewound", source=self._source, partition=str(owned.tp), offset=state[1])

    def _seek(self, owned: OwnedPartition, offset: int) -> None:
        """Move the partition's fetch position to ``offset``.

        Once Kafka refused an offset (auto.offset.reset=error), librdkafka leaves the
        partition's fetcher stopped and ``seek()`` fails with _STATE, however often it is
        retried; re-assigning the partition at ``offset`` restarts the fetcher. Eager
        assignment can only be replaced whole: the other partitions are re-assigned at the
        position the consumer reached (what it prefetched beyond is fetched again and the
        buffers drop what they already hold), so nothing is skipped there either.
        """
        target = KafkaTopicPartition(owned.tp.topic, owned.tp.partition, offset)
        try:
            self._consumer.seek(target)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._STATE:
                raise
        if self._handler.incremental:
            self._consumer.incremental_unassign([KafkaTopicPartition(owned.tp.topic, owned.tp.partition)])
            self._consumer.incremental_assign([target])
        else:
            others = [o for o in self._assignment if o.tp != owned.tp]
            reached = self._consumer.position([KafkaTopicPartition(o.tp.topic, o.tp.partition) for o in others])
            assign = [target]
            for o, at in zip(others, reached, strict=True):
                position = (
                    at.offset
                    if at.offset >= 0
                    else (o.buffer.position if o.buffer.position is not None else start_offset(o.claim))
                )
                assign.append(KafkaTopicPartition(o.tp.topic, o.tp.partition, position))
            self._consumer.assign(assign)
        # A new assignment starts unpaused (librdkafka may keep the flag: make it true);
        # the backpressure pass pauses it again if it must be.
        self._consumer.resume([KafkaTopicPartition(owned.tp.topic, owned.tp.partition)])
        owned.paused = False
        log.info(
            "partition_fetch_restarted",
            source=self._source,
            worker=self._worker_id,
            partition=str(owned.tp),
            offset=offset,
        )

    # -- offsets no longer in the log ------------------------------------------------

    def _resolve_gap(self, owned: OwnedPartition, now: float) -> None:
        """Measure what the log lost against the *stored* offset and act on the policy.

        The partition's in-flight splits are dead (killed when Kafka refused the offset), so
        the stored next_offset is final: the lost range is ``[next_offset, earliest)``.
        ``fail`` records the gap and leaves the partition stopped; ``earliest`` moves
        next_offset past the gap in the same transaction that records it (serial-guarded
        like a publish), then consumes from ``earliest``. Kafka or the metastore not
        answering: retried a few seconds later, never skipped.
        """
        tp = owned.tp
        fields: dict[str, Any] = {
            "source": self._source,
            "worker": self._worker_id,
            "topic": tp.topic,
            "partition": tp.partition,
        }
        owned.retry_at = now + 5.0
        try:
            state = self._store.partition_state(self._source, tp)
        except MetastoreError as exc:
            self._metrics.metastore_errors.labels(self._source).inc()
            log.warning("offset_gap_check_failed", error=str(exc), **fields)
            return
        if state is None or state[0] != owned.claim.serial:
            owned.status = PartitionStatus.FENCED
            owned.gap_pending = False
            log.warning(
                "partition_fenced", serial=owned.claim.serial, stored_serial=state[0] if state else None, **fields
            )
            return
        stored = state[1] if state[1] is not None else owned.refused_offset
        try:
            low, high = self._consumer.get_watermark_offsets(
                KafkaTopicPartition(tp.topic, tp.partition), timeout=5.0, cached=False
            )
        except KafkaException as exc:
            log.warning("offset_gap_check_failed", error=str(exc), **fields)
            return
        if stored is None or stored < 0 or low <= stored <= high:
            # The stored offset is in the log: only the position the consumer had reached was
            # refused (e.g. records buffered past a split that was then killed). Re-read.
            owned.gap_pending = False
            log.info("offset_in_range_again", stored=stored, earliest=low, high_watermark=high, **fields)
            self._schedule_rewind(owned)
            return
        if stored > high:
            # Past the log end: the topic was re-created or truncated. Not a gap to skip.
            owned.gap_pending = False
            log.error(
                "offset_out_of_range",
                stored=stored,
                earliest=low,
                high_watermark=high,
                action="partition stopped; the stored offset is past the log end",
                **fields,
            )
            self._registry.error(
                "OFFSET_OUT_OF_RANGE",
                f"{tp}: stored offset {stored} is past the log end {high}"
                " (topic re-created?); partition stopped, nothing skipped",
            )
            return
        lost = {"from_offset": stored, "to_offset": low, "lost_records": low - stored}
        try:
            if self._spec.on_offset_out_of_range == "earliest":
                gap_id = self._store.skip_gap(self._source, self._worker_id, tp, owned.claim.serial, stored, low)
            else:
                self._store.record_gap(self._source, self._worker_id, tp, stored, low)
        except PublishConflict as exc:
            owned.gap_pending = False
            log.warning("offset_gap_conflict", reason=exc.reason, **lost, **fields)
            if exc.reason == "serial":
                owned.status = PartitionStatus.FENCED
            else:
                self._schedule_rewind(owned)
            return
        except MetastoreError as exc:
            self._metrics.metastore_errors.labels(self._source).inc()
            log.warning("offset_gap_record_failed", error=str(exc), **lost, **fields)
            return
        owned.gap_pending = False
        skipped = self._spec.on_offset_out_of_range == "earliest"
        action = GapAction.SKIPPED if skipped else GapAction.STOPPED
        self._metrics.offset_gap_records.labels(self._source, action).inc(low - stored)
        if not skipped:
            log.error("offset_out_of_range", **lost, action="partition stopped; nothing skipped", **fields)
            self._registry.error(
                "OFFSET_OUT_OF_RANGE",
                f"{tp}: offsets [{stored}, {low}) are no longer in the log;"
                ' partition stopped, nothing skipped (on_offset_out_of_range = "fail")',
            )
            return
        log.error("offset_gap_skipped", gap_id=gap_id, **lost, policy="earliest", **fields)
        self._registry.error(
            "OFFSET_GAP_SKIPPED",
            f"{tp}: offsets [{stored}, {low}) were no longer in the log and"
            f" were skipped (gap {gap_id}; acknowledge with `ingest gaps ack`)",
        )
        try:
            self._seek(owned, low)
        except KafkaException as exc:
            # next_offset already moved: a rewind re-seeks to it.
            log.warning("rewind_seek_failed", error=str(exc), **fields)
            self._schedule_rewind(owned)
            return
        owned.reset_buffer(low)
        owned.status = PartitionStatus.ACTIVE

    def _gaps_due(self, now: float) -> None:
        for owned in self._assignment:
            if owned.status is PartitionStatus.OUT_OF_RANGE and owned.gap_pending and owned.retry_at <= now:
                self._resolve_gap(owned, now)

    # -- backpressure --------------------------------------------------------------

    def _apply_backpressure(self) -> None:
        limits = self._spec.split
        held = self._pipeline.inflight_bytes + self._assignment.buffered_bytes()
        full = (
            self._pipeline.inflight_count >= limits.max_in_flight or held >= limits.max_in_flight_bytes or self.holding
        )
        self._pause({o.tp for o in self._assignment if full or o.status is not PartitionStatus.ACTIVE})

    def _pause(self, wanted: set[TopicPartition]) -> None:
        to_pause = [o for o in self._assignment if o.tp in wanted and not o.paused]
        to_resume = [o for o in self._assignment if o.tp not in wanted and o.paused]
        if to_pause:
            self._consumer.pause([KafkaTopicPartition(o.tp.topic, o.tp.partition) for o in to_pause])
            for o in to_pause:
                o.paused = True
        if to_resume:
            self._consumer.resume([KafkaTopicPartition(o.tp.topic, o.tp.partition) for o in to_resume])
            for o in to_resume:
                o.paused = False

    def _update_lag(self) -> None:
        """Per-partition lag in records (Kafka's cached high watermark minus the published
        offset) and in seconds (age of the oldest record consumed but not yet published)."""
        now_ms = time.time() * 1000
        for owned in self._assignment:
            tp = owned.tp
            labels = (self._source, tp.topic, str(tp.partition))
            published = owned.published_end if owned.published_end is not None else owned.claim.next_offset
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    KafkaTopicPartition(tp.topic, tp.partition), cached=True
                )
            except KafkaException:
                high = -1
            if high >= 0 and published is not None:
                self._metrics.partition_lag_records.labels(*labels).set(max(0, high - published))
            oldest = self._pipeline.oldest_pending_ms(tp)
            if oldest is None:
                oldest = owned.buffer.first_timestamp_ms()
            self._metrics.partition_lag_seconds.labels(*labels).set(
                0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
            )

    def _update_gauges(self) -> None:
        source = self._source
        self._metrics.paused_partitions.labels(source).set(sum(1 for o in self._assignment if o.paused))
        self._metrics.inflight_splits.labels(source).set(self._pipeline.inflight_count)
        self._metrics.set_worker_state(self.state)
        self._metrics.inflight_bytes.labels(source).set(self._pipeline.inflight_bytes)
        self._metrics.buffered_bytes.labels(source).set(self._assignment.buffered_bytes())
