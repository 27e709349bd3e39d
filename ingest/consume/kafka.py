"""The worker's one boundary to its consumer-group member: what the consumer loop and the
rebalance handler may ask of it, typed with the project's own values, and its confluent-kafka
implementation.

The member never reads records: it joins the group, gets partitions assigned and revoked,
positions and validates them, and commits published offsets as advice. Every assigned
partition is paused from the moment it is assigned, so librdkafka fetches nothing; the records
of each split are read by Spark (ingest.builder.kafka_read). Where each partition's log ends
is asked of the brokers separately (ingest.consume.log_offsets).

Everything librdkafka-specific lives here and nowhere else:
- error codes become the project's values and exceptions: a detected log truncation
  (``auto.offset.reset=error``) is an event of a :class:`Batch`, a fatal error raises
  :class:`KafkaFatal`, a failing call raises :class:`KafkaCallFailed`;
- KIP-320's answers: a truncation comes back as _AUTO_OFFSET_RESET whose text ends with
  librdkafka's own text for _LOG_TRUNCATION and names the validated position and where the
  broker's log of that epoch ends (:class:`Truncation`); the validations themselves are asked
  on a consumer of their own (ingest.consume.validator), since this one never fetches;
- its quirks: a partition librdkafka started fetching before the pause took effect delivers a
  few records, which are dropped here (counted in :attr:`Batch.records_dropped`);
- eager and incremental (cooperative) assignment behind one ``assign`` / ``unassign`` (a
  partition's pause flag survives an eager unassign/assign: every assignment pauses anew).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.config import kafka_error
from ingest.errors import WorkerFailed
from ingest_common.errors import IngestError
from ingest_common.model import PartitionClaim, TopicPartition

log = structlog.get_logger(__name__)


class KafkaFatal(WorkerFailed):
    """librdkafka raised a fatal error (e.g. fenced by a newer static member): the consumer is unusable."""


class KafkaCallFailed(IngestError):
    """A consumer call failed (not assigned, broker unreachable, timed out). Retrying later may work."""


# How librdkafka ends the error text of a truncation it detected (its text for _LOG_TRUNCATION).
TRUNCATION_TEXT = KafkaError(KafkaError._LOG_TRUNCATION).str()
# "... at offset 15 (leader epoch 0): broker end offset is 0 (offset leader epoch 0) ...", or
# "No epoch found less or equal to offset 15 (leader epoch 0): broker end offset is -1 ...".
_TRUNCATION_AT = re.compile(r"offset (\d+) \(leader epoch (-?\d+)\): broker end offset is (-?\d+)")


@dataclass(frozen=True, slots=True)
class Truncation:
    """librdkafka's KIP-320 validation failed: the broker's log of ``leader_epoch`` ends at
    ``end_offset`` (-1: the broker has no epoch that old), below ``offset``, the position validated."""

    offset: int
    leader_epoch: int
    end_offset: int

    @staticmethod
    def parse(text: str) -> Truncation | None:
        """The truncation an error text reports; None if it reports none (or not legibly)."""
        if TRUNCATION_TEXT not in text:
            return None
        found = _TRUNCATION_AT.search(text)
        if found is None:
            return None
        return Truncation(int(found[1]), int(found[2]), int(found[3]))


@dataclass(slots=True)
class Batch:
    """One ``poll``: the events librdkafka delivered."""

    # (partition, offset, error text): the broker no longer has ``offset`` (auto.offset.reset=error).
    refused: list[tuple[TopicPartition, int | None, str]] = field(default_factory=list)
    # (partition, truncation, error text): the log was truncated below a validated position (KIP-320).
    truncated: list[tuple[TopicPartition, Truncation, str]] = field(default_factory=list)
    # (error name, error text): anything else librdkafka reported; logged and counted, not fatal.
    errors: list[tuple[str, str]] = field(default_factory=list)
    # Records librdkafka fetched before a partition's pause took effect: never used.
    records_dropped: int = 0


def start_offset(claim: PartitionClaim) -> int:
    """Where a claimed partition is read from: the stored offset, pinned at its first claim
    (ingest.consume.rebalance). A claim with nothing stored was superseded before it could pin: it is
    fenced and takes nothing, so the start position here only gives the consumer an offset."""
    if claim.next_offset is not None:
        return claim.next_offset
    return OFFSET_BEGINNING if claim.initial_position == "earliest" else OFFSET_END


class RebalanceListener(Protocol):
    """What the consumer calls back, on the polling thread, inside ``poll``."""

    def on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None: ...
    def on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None: ...
    def on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None: ...


class Consumer(Protocol):
    """The group member's operations. Only the polling thread may call them: a call from
    another thread while ``poll`` runs blocks (measured: it never returned)."""

    @property
    def incremental(self) -> bool:
        """Cooperative (incremental) assignment, or eager."""
        ...

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None: ...

    def poll(self, timeout_s: float) -> Batch:
        """Serve the group's callbacks and librdkafka's events; raises KafkaFatal on a fatal error."""
        ...

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Add (incremental) or set (eager) the assignment, each partition at its offset and
        paused (nothing is ever fetched)."""
        ...

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        """Remove these partitions (incremental) or the whole assignment (eager)."""
        ...

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit to the consumer group, asynchronously (advice only). Raises KafkaCallFailed."""
        ...

    def close(self) -> None: ...


def _ktp(tp: TopicPartition, offset: int | None = None, leader_epoch: int | None = None) -> KafkaTopicPartition:
    if offset is None:
        return KafkaTopicPartition(tp.topic, tp.partition)
    if leader_epoch is None:
        return KafkaTopicPartition(tp.topic, tp.partition, offset)
    return KafkaTopicPartition(tp.topic, tp.partition, offset, leader_epoch=leader_epoch)


def _tps(partitions: Iterable[KafkaTopicPartition]) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in partitions]


def kafka_error_text(exc: KafkaException) -> str:
    error = kafka_error(exc)
    return error.str() if error is not None else str(exc)


class ConfluentConsumer:
    """:class:`Consumer` over confluent-kafka's ``Consumer`` (made by ``config.kafka_client``)."""

    def __init__(self, consumer: Any, *, incremental: bool) -> None:
        self._consumer = consumer
        self._incremental = incremental

    @property
    def incremental(self) -> bool:
        return self._incremental

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        def on_assign(_consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
            listener.on_assign(self, _tps(partitions))

        def on_revoke(_consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
            listener.on_revoke(self, _tps(partitions))

        def on_lost(_consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
            listener.on_lost(self, _tps(partitions))

        self._consumer.subscribe(list(topics), on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def poll(self, timeout_s: float) -> Batch:
        messages = self._consumer.consume(100, timeout_s)
        batch = Batch()
        for msg in messages:
            err = msg.error()
            if err is None:
                batch.records_dropped += 1
                continue
            tp = TopicPartition(msg.topic(), msg.partition()) if msg.topic() is not None else None
            if err.fatal():
                raise KafkaFatal(f"fatal Kafka error: {err.str()}")
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.code() == KafkaError._AUTO_OFFSET_RESET and tp is not None:
                truncation = Truncation.parse(err.str())
                if truncation is not None:
                    batch.truncated.append((tp, truncation, err.str()))
                else:
                    batch.refused.append((tp, msg.offset(), err.str()))
            else:
                batch.errors.append((err.name(), err.str()))
        return batch

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        partitions = [_ktp(tp, offset) for tp, offset in offsets.items()]
        if self._incremental:
            self._consumer.incremental_assign(partitions)
        else:
            self._consumer.assign(partitions)
        if partitions:
            # Nothing is ever fetched: Spark reads the records. Paused before the callback
            # returns, so librdkafka has no turn to start a fetch in between (at most a fetch
            # already decided is delivered, and dropped).
            self._consumer.pause([_ktp(tp) for tp in offsets])

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        if self._incremental:
            self._consumer.incremental_unassign([_ktp(tp) for tp in tps])
        else:
            self._consumer.unassign()

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            self._consumer.commit(offsets=[_ktp(tp, o) for tp, o in sorted(offsets.items())], asynchronous=True)
        except KafkaException as exc:  # not in a group right now, a closed consumer
            raise KafkaCallFailed(kafka_error_text(exc)) from exc

    def close(self) -> None:
        self._consumer.close()


def commit_callback(report: Callable[[str | None, int, int], None]) -> Callable[[Any, list[Any]], None]:
    """librdkafka's ``on_commit`` as ``report(error text or None, partitions failed, partitions)``."""

    def on_commit(error: KafkaError | None, partitions: list[KafkaTopicPartition]) -> None:
        failed = [p for p in partitions if p.error is not None]
        reason = str(error) if error is not None else (str(failed[0].error) if failed else None)
        report(reason, len(failed) or (len(partitions) if error is not None else 0), len(partitions))

    return on_commit
