"""The worker's one boundary to Kafka: what the consumer loop and the rebalance handler may
ask of a consumer, typed with the project's own values, and its confluent-kafka
implementation.

Everything librdkafka-specific lives here and nowhere else:
- error codes become the project's values and exceptions: end of partition, a refused
  offset and a detected log truncation (``auto.offset.reset=error``) are events of a
  :class:`Batch`, a fatal error raises :class:`KafkaFatal`, a failing call raises
  :class:`KafkaCallFailed`;
- KIP-320: a position stored with the leader epoch of the record before it is validated by
  the broker (OffsetForLeaderEpoch). librdkafka validates on ``seek()`` with an epoch, not on
  ``assign()`` (tests/contract/test_kafka_contract.py shows both), so every partition assigned
  or sought at such a position is sought there with its epoch; a seek the fetcher is not ready
  for yet (_STATE) leaves the partition paused until a later poll's seek goes through. A
  truncation comes back as _AUTO_OFFSET_RESET whose text ends with librdkafka's own text for
  _LOG_TRUNCATION and names the validated position and where the broker's log of that epoch
  ends (:class:`Truncation`);
- its quirks: after an offset refusal the partition's fetcher stays stopped and ``seek()``
  fails with _STATE however often it is retried, so :meth:`seek` re-assigns the partition; a
  partition's pause flag survives an eager unassign/assign, so every (re)assignment resumes
  what it assigns, and the paused set lives and dies with the assignment;
- eager and incremental (cooperative) assignment behind one ``assign`` / ``unassign``.

Records pass through as confluent-kafka's own message objects, typed by :class:`Message`
(:class:`ingest.splits.chunks.Record` and where it came from): nothing is allocated per record
here. The consumer loop turns each poll's messages into Arrow chunks at once and drops them
(ingest.splits.chunks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.errors import WorkerFailed
from ingest.splits.chunks import Record
from ingest_common.errors import IngestError
from ingest_common.model import PartitionClaim, TopicPartition

log = structlog.get_logger(__name__)


class KafkaFatal(WorkerFailed):
    """librdkafka raised a fatal error (e.g. fenced by a newer static member): the consumer is unusable."""


class KafkaCallFailed(IngestError):
    """A consumer call failed (not assigned, broker unreachable, timed out). Retrying later may work."""


class Message(Record, Protocol):
    """A record as the consumer delivers it (confluent-kafka's Message, or a test double):
    what a chunk reads, plus where it came from."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...


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
    """One ``poll``: the records, and the events librdkafka delivered among them."""

    records: Sequence[Message] = ()
    # (partition, offset): everything before ``offset`` was delivered (enable.partition.eof).
    ends: list[tuple[TopicPartition, int]] = field(default_factory=list)
    # (partition, offset, error text): the broker no longer has ``offset`` (auto.offset.reset=error).
    refused: list[tuple[TopicPartition, int | None, str]] = field(default_factory=list)
    # (partition, truncation, error text): the log was truncated below a validated position (KIP-320).
    truncated: list[tuple[TopicPartition, Truncation, str]] = field(default_factory=list)
    # (error name, error text): anything else librdkafka reported; logged and counted, not fatal.
    errors: list[tuple[str, str]] = field(default_factory=list)


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


class Watermarks(Protocol):
    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        """(earliest, high) asked of the broker. Raises KafkaCallFailed."""
        ...


class Consumer(Watermarks, Protocol):
    """The consumer operations the worker uses. Only the polling thread may call them: a
    call from another thread while ``poll`` runs blocks (measured: it never returned), so the
    background thread asks for watermarks through a client of its own (ConfluentWatermarks)."""

    @property
    def incremental(self) -> bool:
        """Cooperative (incremental) assignment, or eager."""
        ...

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None: ...

    def poll(self, max_records: int, timeout_s: float) -> Batch:
        """Up to ``max_records`` records; raises KafkaFatal on a fatal error."""
        ...

    def assign(
        self, offsets: Mapping[TopicPartition, int], leader_epochs: Mapping[TopicPartition, int] | None = None
    ) -> None:
        """Add (incremental) or set (eager) the assignment, each partition at its offset, unpaused.
        ``leader_epochs``: the leader epoch of the record before a partition's offset, where
        known; the broker validates that position (a truncated log becomes a ``Batch.truncated``)."""
        ...

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        """Remove these partitions (incremental) or the whole assignment (eager)."""
        ...

    def seek(
        self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int], leader_epoch: int | None = None
    ) -> None:
        """Move ``tp``'s fetch position to ``offset``; the partition is unpaused afterwards if it
        had to be re-assigned. ``others``: where each other assigned partition's buffer stands,
        used when an eager re-assignment must re-position them. ``leader_epoch``: as for
        :meth:`assign`. Raises KafkaCallFailed."""
        ...

    def set_paused(self, wanted: Iterable[TopicPartition]) -> None:
        """Pause exactly ``wanted`` among the assigned partitions, resume the others."""
        ...

    def paused(self) -> frozenset[TopicPartition]: ...

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The last high watermark the consumer saw (no request); None when unknown."""
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


def _text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


class ConfluentConsumer:
    """:class:`Consumer` over confluent-kafka's ``Consumer`` (made by ``config.kafka_client``)."""

    def __init__(self, consumer: Any, *, incremental: bool) -> None:
        self._consumer = consumer
        self._incremental = incremental
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        # Partitions assigned (with their offsets) by a rebalance callback inside the current poll.
        self._assigned_in_poll: dict[TopicPartition, int] = {}
        # (offset, leader epoch) of each partition assigned or sought at a stored position whose
        # epoch is known: every (re)assignment or seek to that offset carries the epoch.
        self._epochs: dict[TopicPartition, tuple[int, int]] = {}
        # Partitions whose validating seek the fetcher was not ready for: paused (outside
        # ``_paused``) until a seek goes through, so nothing is read from an unvalidated position.
        self._validating: set[TopicPartition] = set()

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

    def poll(self, max_records: int, timeout_s: float) -> Batch:
        self._assigned_in_poll = {}
        if self._validating:
            self._validate(sorted(self._validating))
        messages = self._consumer.consume(max_records, timeout_s)
        if not messages:
            return Batch()
        if self._assigned_in_poll:
            messages = self._without_stale(messages)
        failed = [m for m in messages if m.error() is not None]
        if not failed:
            return Batch(messages)
        batch = Batch([m for m in messages if m.error() is None])
        for msg in failed:
            err = msg.error()
            tp = TopicPartition(msg.topic(), msg.partition()) if msg.topic() is not None else None
            if err.fatal():
                raise KafkaFatal(f"fatal Kafka error: {err.str()}")
            if err.code() == KafkaError._PARTITION_EOF and tp is not None and msg.offset() is not None:
                batch.ends.append((tp, msg.offset()))
            elif err.code() == KafkaError._AUTO_OFFSET_RESET and tp is not None:
                truncation = Truncation.parse(err.str())
                if truncation is not None:
                    batch.truncated.append((tp, truncation, err.str()))
                else:
                    batch.refused.append((tp, msg.offset(), err.str()))
            else:
                batch.errors.append((err.name(), err.str()))
        return batch

    def _without_stale(self, messages: list[Any]) -> list[Any]:
        """librdkafka serves rebalance callbacks inside ``consume()``; records it had taken off
        the queue before the callback may share the batch with the new assignment. Such a
        record of a partition fetched under its previous assignment, past where the partition
        is assigned now, would be taken by a buffer starting at the claimed offset as its first
        record, skipping the offsets between. Which records came after the assignment cannot be
        told, so every record of a partition assigned during this poll is dropped and the
        partition sought back to its assigned offset: the records are fetched again, in order.
        (A guard: no such loss has been observed; the cost is one re-fetch after an assignment.)"""
        fresh = {(tp.topic, tp.partition) for tp in self._assigned_in_poll}
        kept = [m for m in messages if (m.topic(), m.partition()) not in fresh]
        if len(kept) < len(messages):
            dropped = {(m.topic(), m.partition()) for m in messages} & fresh
            for tp, offset in self._assigned_in_poll.items():
                if (tp.topic, tp.partition) in dropped:
                    self.seek(tp, offset, self._assigned_in_poll, self._epoch_at(tp, offset))
            log.info(
                "records_refetched_after_assign",
                partitions=sorted(f"{t}[{p}]" for t, p in dropped),
                records=len(messages) - len(kept),
            )
        return kept

    def assign(
        self, offsets: Mapping[TopicPartition, int], leader_epochs: Mapping[TopicPartition, int] | None = None
    ) -> None:
        self._assigned_in_poll.update(offsets)
        if not self._incremental:
            self._epochs.clear()
            self._validating.clear()
        for tp, offset in offsets.items():
            self._validating.discard(tp)
            epoch = (leader_epochs or {}).get(tp)
            if epoch is None:
                self._epochs.pop(tp, None)
            else:
                self._epochs[tp] = (offset, epoch)
        partitions = [_ktp(tp, offset, self._epoch_at(tp, offset)) for tp, offset in offsets.items()]
        if self._incremental:
            self._consumer.incremental_assign(partitions)
            self._assigned.update(offsets)
        else:
            self._consumer.assign(partitions)
            self._assigned = set(offsets)
            self._paused.clear()
        if partitions:
            # librdkafka keeps a partition's pause flag across an eager unassign/assign; a new
            # assignment starts unpaused, as the paused set says.
            self._consumer.resume(partitions)
            self._paused.difference_update(offsets)
        self._validate(sorted(tp for tp in offsets if tp in self._epochs))

    def _epoch_at(self, tp: TopicPartition, offset: int) -> int | None:
        """The leader epoch known for ``tp`` at exactly ``offset`` (its stored position)."""
        known = self._epochs.get(tp)
        return known[1] if known is not None and known[0] == offset else None

    def _validate(self, tps: Sequence[TopicPartition]) -> None:
        """Seek each partition to its stored position with its leader epoch: librdkafka asks the
        broker whether that epoch's log still reaches the position (an ``assign`` alone is not
        validated). A partition whose fetcher has not started yet (an earlier unassign still
        stopping, a commit in flight) refuses the seek with _STATE: it stays paused and the seek
        is tried again at the next poll."""
        for tp in tps:
            known = self._epochs.get(tp)
            if known is None or tp not in self._assigned:
                self._validating.discard(tp)
                continue
            try:
                self._consumer.seek(_ktp(tp, known[0], known[1]))
            except KafkaException as exc:
                if tp not in self._validating:
                    self._consumer.pause([_ktp(tp)])
                    self._validating.add(tp)
                    log.info("position_validation_deferred", partition=str(tp), offset=known[0], error=_text(exc))
                continue
            if tp in self._validating:
                self._validating.discard(tp)
                if tp not in self._paused:
                    self._consumer.resume([_ktp(tp)])

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        if self._incremental:
            self._consumer.incremental_unassign([_ktp(tp) for tp in tps])
            self._assigned.difference_update(tps)
            self._paused.difference_update(tps)
            self._validating.difference_update(tps)
            for tp in tps:
                self._epochs.pop(tp, None)
        else:
            self._consumer.unassign()
            self._assigned.clear()
            self._paused.clear()
            self._validating.clear()
            self._epochs.clear()

    def seek(
        self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int], leader_epoch: int | None = None
    ) -> None:
        if leader_epoch is None:
            self._epochs.pop(tp, None)
        else:
            self._epochs[tp] = (offset, leader_epoch)
        try:
            self._consumer.seek(_ktp(tp, offset, leader_epoch))
            if tp in self._validating:
                self._validating.discard(tp)
                if tp not in self._paused:
                    self._consumer.resume([_ktp(tp)])
            return
        except KafkaException as exc:
            if _code(exc) != KafkaError._STATE:
                raise KafkaCallFailed(f"seek {tp} to {offset}: {_text(exc)}") from exc
        try:
            self._restart_fetch(tp, offset, others)
        except KafkaException as exc:
            raise KafkaCallFailed(f"re-assign {tp} at {offset}: {_text(exc)}") from exc
        log.info("partition_fetch_restarted", partition=str(tp), offset=offset)

    def _restart_fetch(self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int]) -> None:
        """Re-assigning the partition at ``offset`` restarts a fetcher stopped by an offset
        refusal. Eager assignment can only be replaced whole: the other partitions are
        re-assigned where the consumer reached (what it prefetched beyond is fetched again and
        the buffers drop what they already hold), so nothing is skipped there either."""
        if self._incremental:
            self._consumer.incremental_unassign([_ktp(tp)])
            self._consumer.incremental_assign([_ktp(tp, offset, self._epoch_at(tp, offset))])
            positioned = [(tp, offset)]
        else:
            rest = sorted(t for t in self._assigned if t != tp)
            reached = self._consumer.position([_ktp(t) for t in rest])
            positioned = [(tp, offset)]
            for t, at in zip(rest, reached, strict=True):
                positioned.append((t, at.offset if at.offset >= 0 else others[t]))
            self._consumer.assign([_ktp(t, o, self._epoch_at(t, o)) for t, o in positioned])
            # Pause flags of the re-assigned partitions are kept by librdkafka: ours still hold.
        self._validating.discard(tp)
        self._consumer.resume([_ktp(tp)])
        self._paused.discard(tp)
        # A re-assignment is not validated: partitions back at their stored position are sought there.
        self._validate([t for t, o in positioned if self._epoch_at(t, o) is not None])

    def set_paused(self, wanted: Iterable[TopicPartition]) -> None:
        target = set(wanted) & self._assigned
        to_pause = sorted(target - self._paused)
        # A partition waiting for its validating seek stays paused whatever the loop wants.
        to_resume = sorted(self._paused - target - self._validating)
        if to_pause:
            self._consumer.pause([_ktp(tp) for tp in to_pause])
        if to_resume:
            self._consumer.resume([_ktp(tp) for tp in to_resume])
        self._paused = target

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def high_watermark(self, tp: TopicPartition) -> int | None:
        try:
            _low, high = self._consumer.get_watermark_offsets(_ktp(tp), cached=True)
        except KafkaException:
            return None
        return int(high) if high is not None and high >= 0 else None

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        return _watermarks(self._consumer, tp, timeout_s)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            self._consumer.commit(offsets=[_ktp(tp, o) for tp, o in sorted(offsets.items())], asynchronous=True)
        except KafkaException as exc:  # not in a group right now, a closed consumer
            raise KafkaCallFailed(_text(exc)) from exc

    def close(self) -> None:
        self._consumer.close()


def _watermarks(client: Any, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    try:
        low, high = client.get_watermark_offsets(_ktp(tp), timeout=timeout_s, cached=False)
    except KafkaException as exc:
        raise KafkaCallFailed(f"watermarks of {tp}: {_text(exc)}") from exc
    return int(low), int(high)


class ConfluentWatermarks:
    """:class:`Watermarks` over a consumer handle of its own that never joins the group, for
    the background thread (the worker's consumer must not be called from it)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        return _watermarks(self._client, tp, timeout_s)

    def close(self) -> None:
        self._client.close()


def commit_callback(report: Callable[[str | None, int, int], None]) -> Callable[[Any, list[Any]], None]:
    """librdkafka's ``on_commit`` as ``report(error text or None, partitions failed, partitions)``."""

    def on_commit(error: KafkaError | None, partitions: list[KafkaTopicPartition]) -> None:
        failed = [p for p in partitions if p.error is not None]
        reason = str(error) if error is not None else (str(failed[0].error) if failed else None)
        report(reason, len(failed) or (len(partitions) if error is not None else 0), len(partitions))

    return on_commit
