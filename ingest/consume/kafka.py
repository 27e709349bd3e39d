"""The worker's one boundary to Kafka: what the consumer loop and the rebalance handler may
ask of a consumer, typed with the project's own values, and its confluent-kafka
implementation.

Everything librdkafka-specific lives here and nowhere else:
- error codes become the project's values and exceptions: end of partition and a refused
  offset (``auto.offset.reset=error``) are events of a :class:`Batch`, a fatal error raises
  :class:`KafkaFatal`, a failing call raises :class:`KafkaCallFailed`;
- its quirks: after an offset refusal the partition's fetcher stays stopped and ``seek()``
  fails with _STATE however often it is retried, so :meth:`seek` re-assigns the partition; a
  partition's pause flag survives an eager unassign/assign, so every (re)assignment resumes
  what it assigns, and the paused set lives and dies with the assignment;
- eager and incremental (cooperative) assignment behind one ``assign`` / ``unassign``.

Records pass through as confluent-kafka's own message objects, typed by
:class:`ingest.build.split.Record`: nothing is allocated per record (except a record's headers, made
Python objects once when the buffer counts the bytes the record holds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.build.split import Record
from ingest.errors import WorkerFailed
from ingest_common.errors import IngestError
from ingest_common.model import PartitionClaim, TopicPartition

log = structlog.get_logger(__name__)


class KafkaFatal(WorkerFailed):
    """librdkafka raised a fatal error (e.g. fenced by a newer static member): the consumer is unusable."""


class KafkaCallFailed(IngestError):
    """A consumer call failed (not assigned, broker unreachable, timed out). Retrying later may work."""


class Message(Record, Protocol):
    """A record as the consumer delivers it (confluent-kafka's Message, or a test double):
    what a split keeps, plus where it came from."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...


@dataclass(slots=True)
class Batch:
    """One ``poll``: the records, and the events librdkafka delivered among them."""

    records: Sequence[Message] = ()
    # (partition, offset): everything before ``offset`` was delivered (enable.partition.eof).
    ends: list[tuple[TopicPartition, int]] = field(default_factory=list)
    # (partition, offset, error text): the broker no longer has ``offset`` (auto.offset.reset=error).
    refused: list[tuple[TopicPartition, int | None, str]] = field(default_factory=list)
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

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Add (incremental) or set (eager) the assignment, each partition at its offset, unpaused."""
        ...

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        """Remove these partitions (incremental) or the whole assignment (eager)."""
        ...

    def seek(self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int]) -> None:
        """Move ``tp``'s fetch position to ``offset``; the partition is unpaused afterwards if it
        had to be re-assigned. ``others``: where each other assigned partition's buffer stands,
        used when an eager re-assignment must re-position them. Raises KafkaCallFailed."""
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


def _ktp(tp: TopicPartition, offset: int | None = None) -> KafkaTopicPartition:
    if offset is None:
        return KafkaTopicPartition(tp.topic, tp.partition)
    return KafkaTopicPartition(tp.topic, tp.partition, offset)


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
                    self.seek(tp, offset, self._assigned_in_poll)
            log.info(
                "records_refetched_after_assign",
                partitions=sorted(f"{t}[{p}]" for t, p in dropped),
                records=len(messages) - len(kept),
            )
        return kept

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._assigned_in_poll.update(offsets)
        partitions = [_ktp(tp, offset) for tp, offset in offsets.items()]
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

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        if self._incremental:
            self._consumer.incremental_unassign([_ktp(tp) for tp in tps])
            self._assigned.difference_update(tps)
            self._paused.difference_update(tps)
        else:
            self._consumer.unassign()
            self._assigned.clear()
            self._paused.clear()

    def seek(self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int]) -> None:
        try:
            self._consumer.seek(_ktp(tp, offset))
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
            self._consumer.incremental_assign([_ktp(tp, offset)])
        else:
            rest = sorted(t for t in self._assigned if t != tp)
            reached = self._consumer.position([_ktp(t) for t in rest])
            assign = [_ktp(tp, offset)]
            for t, at in zip(rest, reached, strict=True):
                assign.append(_ktp(t, at.offset if at.offset >= 0 else others[t]))
            self._consumer.assign(assign)
            # Pause flags of the re-assigned partitions are kept by librdkafka: ours still hold.
        self._consumer.resume([_ktp(tp)])
        self._paused.discard(tp)

    def set_paused(self, wanted: Iterable[TopicPartition]) -> None:
        target = set(wanted) & self._assigned
        to_pause = sorted(target - self._paused)
        to_resume = sorted(self._paused - target)
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
