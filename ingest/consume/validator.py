"""KIP-320 for a worker that reads no record: before a partition's splits are cut from a
position known under a leader epoch, the broker confirms that the log of that epoch still
reaches the position.

A fetching consumer validates its position at every leader change before it fetches again,
and finds a log truncated below what it read (an unclean leader election, a lost broker log).
The worker's group member never fetches, so its position tells librdkafka nothing; this
validator asks instead, on a librdkafka consumer of its own that is in no group: the position
is assigned paused and sought with its leader epoch (librdkafka sends OffsetForLeaderEpoch),
then resumed. librdkafka fetches only once the validation passed, and drops any fetch made
before the seek, so the first thing the validator receives for the partition is the answer:
- a record, or the end of the partition: the position is **valid**;
- librdkafka's _LOG_TRUNCATION text: **truncated** below the position (:class:`Truncation`);
- any other offset refusal: the position is **gone** from the log (retention).
A few records are fetched (``max.partition.fetch.bytes`` is 1: one batch) and dropped.

When: a claimed or repositioned partition whose stored offset has a leader epoch, and every
time a log-end answer names a leader epoch other than the one the partition's position was
cut under (ingest.consume.log_ends). The partition's cutter cuts nothing until the answer
(ingest.consume.cutter). A validation unanswered for ``RETRY_S`` is asked again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.consume.kafka import Truncation, kafka_error_text
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)

# A validation the broker has not answered for this long is asked again.
RETRY_S = 10.0


class Verdict(enum.Enum):
    VALID = "valid"
    TRUNCATED = "truncated"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Validation:
    tp: TopicPartition
    offset: int
    leader_epoch: int
    verdict: Verdict
    truncation: Truncation | None = None
    text: str = ""


class PositionValidator(Protocol):
    def validate(self, tp: TopicPartition, offset: int, leader_epoch: int) -> None:
        """Ask whether ``tp``'s log of ``leader_epoch`` still reaches ``offset`` (replaces a
        validation of ``tp`` under way)."""
        ...

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop the validations of these partitions (revoked, lost, repositioned)."""
        ...

    def poll(self) -> list[Validation]:
        """The answers that arrived; never blocks."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Pending:
    offset: int
    leader_epoch: int
    asked_at: float
    sought: bool = False


def _ktp(tp: TopicPartition, offset: int | None = None, leader_epoch: int | None = None) -> KafkaTopicPartition:
    if offset is None:
        return KafkaTopicPartition(tp.topic, tp.partition)
    if leader_epoch is None:
        return KafkaTopicPartition(tp.topic, tp.partition, offset)
    return KafkaTopicPartition(tp.topic, tp.partition, offset, leader_epoch=leader_epoch)


class ConfluentValidator:
    """:class:`PositionValidator` over a confluent-kafka ``Consumer`` that never subscribes
    (``config.validator_config``). Only the polling thread calls it."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._pending: dict[TopicPartition, _Pending] = {}
        self._closed = False

    def validate(self, tp: TopicPartition, offset: int, leader_epoch: int) -> None:
        if tp in self._pending:
            self._unassign([tp])
        self._consumer.incremental_assign([_ktp(tp, offset)])
        self._consumer.pause([_ktp(tp)])
        self._pending[tp] = _Pending(offset, leader_epoch, time.monotonic())
        self._seek_pending()

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        if self._closed:  # the group member's last revoke comes at its close, after this one's
            return
        self._unassign([tp for tp in tps if tp in self._pending])

    def poll(self) -> list[Validation]:
        if not self._pending or self._closed:
            return []
        self._retry_unanswered()
        self._seek_pending()
        answers: list[Validation] = []
        for msg in self._consumer.consume(100, 0):
            if msg.topic() is None:
                continue
            tp = TopicPartition(msg.topic(), msg.partition())
            pending = self._pending.get(tp)
            if pending is None or not pending.sought:
                continue
            answer = self._answer(tp, pending, msg.error())
            if answer is not None:
                answers.append(answer)
                self._unassign([tp])
        return answers

    def close(self) -> None:
        self._closed = True
        self._pending.clear()
        self._consumer.close()

    # -- internals -----------------------------------------------------------------

    @staticmethod
    def _answer(tp: TopicPartition, pending: _Pending, error: KafkaError | None) -> Validation | None:
        at = (tp, pending.offset, pending.leader_epoch)
        if error is None or error.code() == KafkaError._PARTITION_EOF:
            return Validation(*at, Verdict.VALID)
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            truncation = Truncation.parse(error.str())
            if truncation is not None:
                return Validation(*at, Verdict.TRUNCATED, truncation, error.str())
            return Validation(*at, Verdict.GONE, text=error.str())
        log.info("position_validation_error", partition=str(tp), error=error.str())
        return None

    def _seek_pending(self) -> None:
        """Seek each validation not sought yet; librdkafka refuses a seek with _STATE until the
        partition's fetcher started: tried again at the next poll."""
        for tp, pending in self._pending.items():
            if pending.sought:
                continue
            try:
                self._consumer.seek(_ktp(tp, pending.offset, pending.leader_epoch))
            except KafkaException as exc:
                log.debug("position_validation_deferred", partition=str(tp), error=kafka_error_text(exc))
                continue
            pending.sought = True
            self._consumer.resume([_ktp(tp)])

    def _retry_unanswered(self) -> None:
        now = time.monotonic()
        for tp, pending in list(self._pending.items()):
            if pending.sought and now - pending.asked_at > RETRY_S:
                log.warning("position_validation_unanswered", partition=str(tp), seconds=round(now - pending.asked_at))
                self.validate(tp, pending.offset, pending.leader_epoch)

    def _unassign(self, tps: list[TopicPartition]) -> None:
        if not tps:
            return
        for tp in tps:
            self._pending.pop(tp, None)
        try:
            self._consumer.incremental_unassign([_ktp(tp) for tp in tps])
        except KafkaException as exc:  # not assigned (any more): nothing to undo
            log.debug("position_validation_unassign", error=kafka_error_text(exc))
