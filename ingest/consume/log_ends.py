"""The polling thread's view of each owned partition's log: a query of every owned
partition's last stable offset and earliest offset (ingest.consume.log_offsets) every
``interval_s``, one at a time, never waited for; each answer is applied at a later step. And
the validations of positions known under a leader epoch (ingest.consume.validator): asked for
each partition whose cutter needs one, their answers applied as they arrive.

What an answer does to an active partition:
- the last stable offset moves the partition's cutter on (ingest.consume.cutter): splits are
  cut from it;
- an earliest offset past the lowest offset not yet published, or a last stable offset below
  where the partition was cut to (the log was truncated or re-created), stops the partition:
  the gap is measured against the stored offset and recorded, skipped or stopped on
  (ingest.consume.gaps), before Spark is asked to read what is gone;
- a topic id (asked after the offsets: ingest.consume.log_offsets) other than the one the
  metastore holds with the partition's offset (or none held yet) stops it the same way before
  any offset of the answer is taken: the gap resolver records the id, or finds the topic
  re-created and keeps the partition stopped. No split is cut from another topic's log.
A partition whose answer failed keeps what it had; the next query asks again. One whose topic
the broker does not know (a pattern source's deleted topic, until the group takes the partition
away: ingest.consume.topic_watch) is logged once and asked again only every
``UNKNOWN_TOPIC_WAIT_S``.

What a validation does: valid, the partition's cuts go on; truncated below the position, or
the position gone from the log, stops the partition as above.
"""

from __future__ import annotations

import structlog

from ingest.consume.assignment import OwnedPartition
from ingest.consume.context import LoopContext
from ingest.consume.gaps import GapResolver
from ingest.consume.log_offsets import UNKNOWN_TOPIC, LogEnd, LogOffsets, OffsetsQuery
from ingest.consume.validator import Validation, Verdict
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)

# How often the owned partitions' log ends are asked for: what a split's age can exceed
# max_age by, at most.
LOG_END_INTERVAL_S = 0.2
# How long a partition whose topic the broker does not know is not asked about again.
UNKNOWN_TOPIC_WAIT_S = 5.0


class LogEnds:
    def __init__(
        self, ctx: LoopContext, offsets: LogOffsets, gaps: GapResolver, *, interval_s: float = LOG_END_INTERVAL_S
    ) -> None:
        self._ctx = ctx
        self._offsets = offsets
        self._gaps = gaps
        self._interval_s = interval_s
        self._query: OffsetsQuery | None = None
        self._due = 0.0
        # While held (suspend, drain), no cutter is told of offsets past where it stood.
        self._held = False
        # The last answer for each owned partition (lag is measured against it).
        self._latest: dict[TopicPartition, LogEnd] = {}
        # Partitions of an unknown topic: when they are asked about again.
        self._unknown: dict[TopicPartition, float] = {}
        self._m_errors = ctx.metrics.kafka_errors.labels(ctx.source)

    def latest(self, tp: TopicPartition) -> LogEnd | None:
        return self._latest.get(tp)

    def hold(self, held: bool) -> None:
        """A hold began (True) or ended: while held, answers still find gaps and truncations,
        but move no cutter past the last stable offset it knew when the hold began."""
        self._held = held

    def step(self, now: float) -> None:
        """Apply the answers that arrived; ask again when due."""
        self._validations()
        if self._query is not None and self._query.done():
            ends, errors = self._query.result()
            self._query = None
            self._apply(ends, errors, now)
        if self._query is None and now >= self._due:
            tps = [o.tp for o in self._ctx.assignment if o.active and self._unknown.get(o.tp, 0.0) <= now]
            if tps:
                self._query = self._offsets.query(tps)
            self._due = now + self._interval_s

    def _validations(self) -> None:
        validator = self._ctx.validator
        for answer in validator.poll():
            self._validated(answer)
        for owned in self._ctx.assignment:
            if owned.active and owned.cutter.needs_validation():
                offset, epoch = owned.cutter.validation_asked()
                validator.validate(owned.tp, offset, epoch)

    def _validated(self, answer: Validation) -> None:
        owned = self._ctx.assignment.get(answer.tp)
        cutter = owned.cutter if owned is not None else None
        if owned is None or cutter is None or not owned.active or not cutter.validating:
            return  # revoked, repositioned or stopped meanwhile
        if (cutter.position, cutter.position_epoch) != (answer.offset, answer.leader_epoch):
            return  # an answer for a position since left
        if answer.verdict is Verdict.VALID:
            cutter.validation_passed()
        else:
            self._gaps.refused(answer.tp, answer.offset, answer.text, answer.truncation)

    def _apply(self, ends: dict[TopicPartition, LogEnd], errors: dict[TopicPartition, str], now: float) -> None:
        owned_tps = set(self._ctx.assignment.tps())
        for tp in [t for t in self._unknown if t not in owned_tps or t in ends]:
            del self._unknown[tp]
        for tp, error in errors.items():
            if error == UNKNOWN_TOPIC:
                if tp not in self._unknown:
                    self._m_errors.inc()
                    log.warning("partition_topic_unknown", source=self._ctx.source, partition=str(tp))
                self._unknown[tp] = now + UNKNOWN_TOPIC_WAIT_S
                continue
            self._m_errors.inc()
            log.warning("log_end_query_failed", source=self._ctx.source, partition=str(tp), error=error)
        for tp in [t for t in self._latest if t not in owned_tps]:
            del self._latest[tp]
        for tp, end in ends.items():
            owned = self._ctx.assignment.get(tp)
            if owned is None:
                continue
            self._latest[tp] = end
            if owned.active:
                self._end(owned, end, now)

    def _end(self, owned: OwnedPartition, end: LogEnd, now: float) -> None:
        cutter = owned.cutter
        if cutter.position is None:
            return
        unpublished = owned.published_end if owned.published_end is not None else owned.claim.next_offset
        floor = cutter.position if unpublished is None else min(unpublished, cutter.position)
        if end.topic_id is not None and end.topic_id != owned.topic_id:
            self._gaps.refused(
                owned.tp,
                floor,
                f"the topic's id is {end.topic_id}, the partition's offset was stored with"
                f" {owned.topic_id or 'no topic id'}",
            )
        elif end.earliest > floor:
            self._gaps.refused(
                owned.tp, floor, f"offsets [{floor}, {end.earliest}) are no longer in the log (earliest {end.earliest})"
            )
        elif cutter.behind_position(end):
            self._gaps.refused(
                owned.tp,
                cutter.position,
                f"the log's last stable offset {end.stable} is below {cutter.position}, where splits were cut to",
            )
        elif not self._held:
            cutter.log_end(end, now)
