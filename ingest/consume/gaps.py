"""Offsets no longer in the log: measure the gap against the *stored* offset and act on the
source's ``on_offset_out_of_range`` policy.

The partition's in-flight splits are dead (killed when Kafka refused the offset), so the stored
next_offset is final: the lost range is ``[next_offset, earliest)``. ``fail`` records the gap
and leaves the partition stopped; ``earliest`` moves next_offset past the gap in the same
transaction that records it (serial-guarded like a publish), then consumes from ``earliest``.
Kafka or the metastore not answering: retried a few seconds later, never skipped.

A log truncation (KIP-320: the broker's log of the stored position's leader epoch ends below
it, after an unclean leader election or a lost broker log, even when the log has grown past
the position again) is measured the same way: when it reaches below the stored offset, the
records published at ``[broker end offset, next_offset)`` are no longer the log's, and the
log holds other records there now. That range is recorded as a gap with reason
``log_truncated`` and the partition stops under either policy (resuming at next_offset would
skip the new records, re-reading would publish offsets twice); ``ingest reset`` resumes it.
A truncation above the stored offset only touched records not published: re-read from the
stored offset (validated again).

A topic deleted and re-created under the same name is another log whose offsets and leader
epochs start again where the old one's did, so neither tells it from the old. Kafka's topic id
(KIP-516) does: every measurement first compares the id the metastore holds with the partition's
offset with Kafka's, asked after the watermarks (migrations/0027). None held yet: Kafka's is
recorded (serial-guarded) and the measurement goes on. Another one: the new log's offsets
``[0, next_offset)`` hold records never read and the records published below next_offset are
no longer the log's, so the range is recorded as a gap with reason ``topic_recreated`` and both
ids, and the partition stops under either policy, as for a truncation; ``ingest reset`` resumes
it in the new topic (and records its id). At a stored offset of 0 nothing of either log lies
below it: the new id is recorded and the partition reads on.

The measurement and the record run in the background (:meth:`GapResolver._measure`); the
verdict is applied on the polling thread (:meth:`GapResolver._apply`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from ingest.consume.assignment import OwnedPartition, PartitionState
from ingest.consume.context import GapStore, LoopContext
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.kafka import KafkaCallFailed, Truncation
from ingest.consume.log_offsets import Watermarks
from ingest.consume.positioning import Positioner, Reason
from ingest_common.backoff import Backoff
from ingest_common.model import ConflictReason, GapAction, KillReason, StoredPosition, TopicPartition
from metastore.errors import PublishConflict

log = structlog.get_logger(__name__)

# Before a gap that could not be measured or recorded is tried again.
GAP_RETRY = Backoff.fixed(5.0)
# Bound of the broker's answer for the partition's watermarks.
WATERMARK_TIMEOUT_S = 5.0


class Verdict(enum.Enum):
    FENCED = "fenced"  # the stored serial moved: another worker owns the partition
    IN_RANGE = "in_range"  # the stored offset is in the log: only a later position was refused
    PAST_END = "past_end"  # the stored offset is past the log end (unclean leader election, re-created topic)
    TRUNCATED = "truncated"  # the log was truncated below the stored offset: recorded, stays stopped
    RECREATED = "recreated"  # the topic was re-created (another topic id): recorded, stays stopped
    STOPPED = "stopped"  # recorded, partition stays stopped (policy fail)
    SKIPPED = "skipped"  # recorded and skipped (policy earliest): consume from `low`
    CONFLICT = "conflict"  # the record/skip was refused (serial or offset moved)
    RETRY = "retry"  # Kafka did not answer


@dataclass(frozen=True, slots=True)
class GapResult:
    verdict: Verdict
    stored: int | None = None
    low: int = 0
    high: int = 0
    stored_serial: int | None = None
    gap_id: int | None = None
    reason: str = ""
    # TRUNCATED, RECREATED: where the lost range starts; what librdkafka reported.
    lost_from: int = 0
    truncation: Truncation | None = None
    # RECREATED: the topic id stored with the offset, and Kafka's now.
    topic_ids: tuple[str, str] | None = None


class GapResolver:
    def __init__(
        self, ctx: LoopContext, *, watermarks: Watermarks, positioner: Positioner, registry: WorkerRegistry
    ) -> None:
        self._ctx = ctx
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._assignment = ctx.assignment
        self._store: GapStore = ctx.store
        self._metrics = ctx.metrics
        # The background thread's client: a watermark request never waits on the polling thread's.
        self._watermarks = watermarks
        self._positioner = positioner
        self._registry = registry

    def refused(self, tp: TopicPartition, offset: int | None, error: str, truncation: Truncation | None = None) -> None:
        """``tp``'s offsets from ``offset`` on are gone from the log (retention, a truncated or
        re-created log), or Kafka found its log truncated below a validated position: stop the
        partition first (nothing of it is cut or published until the gap is measured and
        recorded), then measure it."""
        owned = self._assignment.get(tp)
        if owned is None or not owned.active:
            return
        owned.refuse(offset, truncation)
        self._ctx.killer.kill([tp], KillReason.OUT_OF_RANGE)
        log.warning(
            "offset_refused",
            source=self._source,
            worker=self._worker_id,
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            error=error,
        )
        self.due(self._ctx.clock.monotonic())

    def due(self, now: float) -> None:
        for owned in self._assignment:
            if owned.gap_due(now):
                # Tried again after GAP_RETRY unless a result settles the partition first.
                owned.call_started(retry_at=now + GAP_RETRY.delay(0))
                skip = self._ctx.specs.spec.on_offset_out_of_range == "earliest"
                tp = owned.tp
                self._ctx.background.submit(
                    partial(self._measure, tp, owned.claim.serial, owned.refused_offset, skip, owned.truncation),
                    partial(self._apply, owned),
                    self._ctx.on_failure(
                        "offset_gap_check_failed", release=owned.call_ended, topic=tp.topic, partition=tp.partition
                    ),
                )

    # -- background thread ---------------------------------------------------------

    def _measure(
        self, tp: TopicPartition, serial: int, refused: int | None, skip: bool, truncation: Truncation | None = None
    ) -> GapResult:
        position = self._store.stored_position(self._source, tp)
        if position is None or position.serial != serial:
            return GapResult(Verdict.FENCED, stored_serial=position.serial if position else None)
        try:
            low, high = self._watermarks.watermarks(tp, WATERMARK_TIMEOUT_S)
            # After the watermarks: the id they are known under (ingest.consume.log_offsets).
            ids = self._watermarks.topic_ids([tp.topic], WATERMARK_TIMEOUT_S)
        except KafkaCallFailed as exc:
            return GapResult(Verdict.RETRY, reason=str(exc))
        if tp.topic not in ids:
            return GapResult(Verdict.RETRY, reason=f"topic {tp.topic} is not known to the broker")
        changed = self._topic_changed(tp, serial, position, ids[tp.topic], low, high)
        if changed is not None:
            return changed
        if truncation is not None:
            return self._measure_truncation(tp, position, truncation, low, high)
        stored = position.next_offset if position.next_offset is not None else refused
        if stored is None or stored < 0 or low <= stored <= high:
            return GapResult(Verdict.IN_RANGE, stored, low, high)
        if stored > high:
            return GapResult(Verdict.PAST_END, stored, low, high)
        try:
            if skip:
                gap_id = self._store.skip_gap(self._source, self._worker_id, tp, serial, stored, low)
                return GapResult(Verdict.SKIPPED, stored, low, high, gap_id=gap_id)
            self._store.record_gap(self._source, self._worker_id, tp, stored, low)
        except PublishConflict as exc:
            return GapResult(Verdict.CONFLICT, stored, low, high, reason=exc.reason)
        return GapResult(Verdict.STOPPED, stored, low, high)

    def _topic_changed(
        self, tp: TopicPartition, serial: int, position: StoredPosition, found: str | None, low: int, high: int
    ) -> GapResult | None:
        """Kafka's topic id ``found`` against the one stored with the offset: None when they are
        one (or Kafka gives none, or none was stored: recorded now), else the verdict."""
        if found is None or position.topic_id == found:
            return None
        stored_id = self._store.record_topic_id(self._source, tp, serial, found)
        if stored_id is None:
            return GapResult(Verdict.FENCED)
        if stored_id == found:
            log.info("topic_id_recorded", topic_id=found, stored_offset=position.next_offset, **self._fields(tp))
            return None
        stored = position.next_offset or 0
        self._store.record_topic_recreation(self._source, self._worker_id, tp, 0, stored, stored_id, found)
        return GapResult(Verdict.RECREATED, stored, low, high, lost_from=0, topic_ids=(stored_id, found))

    def _measure_truncation(
        self, tp: TopicPartition, position: StoredPosition, truncation: Truncation, low: int, high: int
    ) -> GapResult:
        stored = position.next_offset
        if stored is None or not _below(truncation, stored, position.leader_epoch):
            return GapResult(Verdict.IN_RANGE, stored, low, high)
        end = truncation.end_offset
        lost_from = end if 0 <= end < stored else max(0, min(low, stored - 1))
        self._store.record_truncation(self._source, self._worker_id, tp, lost_from, stored)
        return GapResult(Verdict.TRUNCATED, stored, low, high, lost_from=lost_from, truncation=truncation)

    # -- polling thread ------------------------------------------------------------

    def _fields(self, tp: TopicPartition) -> dict[str, Any]:
        return {"source": self._source, "worker": self._worker_id, "topic": tp.topic, "partition": tp.partition}

    def _apply(self, owned: OwnedPartition, result: GapResult) -> None:
        owned.call_ended()
        if self._assignment.get(owned.tp) is not owned or owned.state is not PartitionState.OUT_OF_RANGE:
            return  # revoked or re-claimed meanwhile
        tp, fields = owned.tp, self._fields(owned.tp)
        marks = {"stored": result.stored, "earliest": result.low, "high_watermark": result.high}
        lost = {
            "from_offset": result.stored,
            "to_offset": result.low,
            "lost_records": result.low - (result.stored or 0),
        }
        verdict = result.verdict
        if verdict is Verdict.RETRY:
            log.warning("offset_gap_check_failed", error=result.reason, **fields)
        elif verdict is Verdict.FENCED:
            owned.fence()
            log.warning("partition_fenced", serial=owned.claim.serial, stored_serial=result.stored_serial, **fields)
        elif verdict is Verdict.IN_RANGE:
            # Only offsets past the stored one were gone (cut into splits that were then
            # killed): cut again from the stored offset.
            log.info("offset_in_range_again", **marks, **fields)
            self._positioner.rewind(owned)
        elif verdict is Verdict.PAST_END:
            owned.gap_settled()
            log.error(
                "offset_out_of_range",
                **marks,
                action="partition stopped, nothing skipped; the log ends below the stored offset"
                " (an unclean leader election truncated it, or the topic was re-created)",
                **fields,
            )
            self._registry.error(
                "OFFSET_OUT_OF_RANGE",
                f"{tp}: stored offset {result.stored} is past the log end {result.high} (an unclean leader"
                " election truncated the log, or the topic was re-created); partition stopped, nothing"
                " skipped; `ingest reset` resumes it",
            )
        elif verdict is Verdict.TRUNCATED:
            self._truncated(owned, result)
        elif verdict is Verdict.RECREATED:
            self._recreated(owned, result)
        elif verdict is Verdict.CONFLICT:
            log.warning("offset_gap_conflict", reason=result.reason, **lost, **fields)
            if result.reason == ConflictReason.SERIAL:
                owned.fence()
            else:
                self._positioner.rewind(owned)
        elif verdict is Verdict.STOPPED:
            owned.gap_settled()
            self._metrics.offset_gap_records.labels(self._source, GapAction.STOPPED).inc(
                result.low - (result.stored or 0)
            )
            log.error("offset_out_of_range", **lost, action="partition stopped; nothing skipped", **fields)
            self._registry.error(
                "OFFSET_OUT_OF_RANGE",
                f"{tp}: offsets [{result.stored}, {result.low}) are no longer"
                ' in the log; partition stopped, nothing skipped (on_offset_out_of_range = "fail")',
            )
        else:
            self._metrics.offset_gap_records.labels(self._source, GapAction.SKIPPED).inc(
                result.low - (result.stored or 0)
            )
            log.error("offset_gap_skipped", gap_id=result.gap_id, **lost, policy="earliest", **fields)
            self._registry.error(
                "OFFSET_GAP_SKIPPED",
                f"{tp}: offsets [{result.stored}, {result.low}) were no longer in"
                f" the log and were skipped (gap {result.gap_id}; acknowledge with `ingest gaps ack`)",
            )
            # next_offset already moved past the gap: if the seek fails, the rewind re-reads it.
            self._positioner.reposition(owned, result.low, Reason.GAP_SKIPPED)

    def _truncated(self, owned: OwnedPartition, result: GapResult) -> None:
        owned.gap_settled()
        tp, stored, lost_from = owned.tp, result.stored or 0, result.lost_from
        epoch = result.truncation.leader_epoch if result.truncation else None
        self._metrics.offset_gap_records.labels(self._source, GapAction.STOPPED).inc(stored - lost_from)
        log.error(
            "log_truncated",
            from_offset=lost_from,
            to_offset=stored,
            leader_epoch=epoch,
            broker_end_offset=result.truncation.end_offset if result.truncation else None,
            high_watermark=result.high,
            action="partition stopped, nothing skipped; the records published at [from_offset, to_offset) are no"
            " longer the log's (an unclean leader election or a lost broker log); `ingest reset` resumes it",
            **self._fields(tp),
        )
        self._registry.error(
            "LOG_TRUNCATED",
            f"{tp}: the log was truncated below the stored offset {stored} (leader epoch {epoch}): offsets"
            f" [{lost_from}, {stored}) were published from records no longer in the log, which holds others"
            " there now (an unclean leader election or a lost broker log); partition stopped, nothing skipped;"
            " `ingest reset` resumes it",
        )

    def _recreated(self, owned: OwnedPartition, result: GapResult) -> None:
        owned.gap_settled()
        tp, stored = owned.tp, result.stored or 0
        old, new = result.topic_ids or ("?", "?")
        self._metrics.offset_gap_records.labels(self._source, GapAction.STOPPED).inc(stored - result.lost_from)
        log.error(
            "topic_recreated",
            from_offset=result.lost_from,
            to_offset=stored,
            stored_topic_id=old,
            topic_id=new,
            high_watermark=result.high,
            action="partition stopped, nothing skipped: the topic was deleted and re-created, the new log's offsets"
            " [from_offset, to_offset) hold records never read and those published there are no longer the log's;"
            " `ingest reset` resumes it in the new topic",
            **self._fields(tp),
        )
        self._registry.error(
            "TOPIC_RECREATED",
            f"{tp}: the topic was deleted and re-created: Kafka's topic id is {new}, the stored offset {stored} was"
            f" read from topic id {old}; the new log's offsets [{result.lost_from}, {stored}) hold records never"
            " read (resuming at the stored offset would skip them); partition stopped, nothing skipped;"
            " `ingest reset` resumes it in the new topic (--to earliest reads it from its start)",
        )


def _below(truncation: Truncation, stored: int, stored_epoch: int | None) -> bool:
    """Whether a truncation reaches below the stored offset: published records are affected."""
    if truncation.offset == stored:
        return True  # the stored position itself failed validation
    if truncation.end_offset >= 0:
        return truncation.end_offset < stored
    # The broker has no epoch as old as the fetch position's. With the stored position's epoch
    # known, re-reading from it validates exactly that; without, it cannot be told: stop.
    return stored_epoch is None
