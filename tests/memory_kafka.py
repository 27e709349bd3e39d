"""An in-memory Kafka for unit tests: a broker whose partitions are lists, the worker's group
member over it (ingest.consume.kafka.Consumer) and its log-end queries
(ingest.consume.log_offsets.LogOffsets).

The test decides when the group assigns, revokes or loses partitions (the callbacks run inside
the next ``poll``, as librdkafka runs them). Retention can drop a partition's head; a
transaction can stay open (the last stable offset stops at its first offset) or end aborted
(its records are never read, its marker takes an offset). Records carry the leader epoch they
were written under; a partition's log can be truncated under a new leader epoch, and a position
sought with a leader epoch is validated as librdkafka does it (KIP-320): a log of that epoch
ending below the position is answered as truncated, with librdkafka's text (the validator's:
tests/contract/test_kafka_truncation_contract.py checks both against a broker). The member
never fetches: as the worker's, its partitions are paused, and the fake builder reads
the records (tests.fakes.FakeBuilder, as Spark reads them from a real broker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

from ingest.consume.kafka import TRUNCATION_TEXT, Batch, KafkaCallFailed, RebalanceListener, Truncation
from ingest.consume.log_offsets import LogEnd
from ingest.consume.validator import Validation, Verdict
from ingest_common.model import TopicPartition


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    offset: int
    value: bytes | None
    key: bytes | None
    leader_epoch: int
    timestamp_ms: int = 1_700_000_000_000
    # A record of an aborted transaction, or a transaction marker: never read.
    invisible: bool = False


class DataLoss(Exception):
    """A read of offsets no longer in the log (Spark's failOnDataLoss)."""


@dataclass
class MemoryBroker:
    logs: dict[TopicPartition, list[MemoryRecord]] = field(default_factory=dict)
    # The first offset still in each partition's log (retention moved it past what was deleted).
    earliest: dict[TopicPartition, int] = field(default_factory=dict)
    # Each partition's current leader epoch (0 until a truncation).
    epochs: dict[TopicPartition, int] = field(default_factory=dict)
    # The first offset of each partition's open transaction: its last stable offset.
    open_transactions: dict[TopicPartition, int] = field(default_factory=dict)
    # Each topic's id (KIP-516); a topic absent has none (as a cluster without ids: not compared).
    topic_ids: dict[str, str] = field(default_factory=dict)

    def produce(self, tp: TopicPartition, *values: bytes | None, key: bytes | None = b"k") -> None:
        log = self.logs.setdefault(tp, [])
        epoch = self.epochs.get(tp, 0)
        for value in values:
            log.append(MemoryRecord(len(log), value, key, epoch))

    def begin_transaction(self, tp: TopicPartition, *values: bytes) -> None:
        """Records of a transaction left open: the last stable offset stops before them."""
        self.open_transactions.setdefault(tp, self.high(tp))
        self.produce(tp, *values)

    def end_transaction(self, tp: TopicPartition, *, commit: bool) -> None:
        """Commit or abort the open transaction: its marker takes an offset; aborted records
        are never read."""
        first = self.open_transactions.pop(tp)
        log = self.logs[tp]
        if not commit:
            log[first:] = [MemoryRecord(r.offset, r.value, r.key, r.leader_epoch, invisible=True) for r in log[first:]]
        log.append(MemoryRecord(len(log), None, None, self.epochs.get(tp, 0), invisible=True))

    def truncate(self, tp: TopicPartition, offset: int) -> None:
        """An unclean leader election: the new leader's log ends at ``offset``, its epoch is higher."""
        del self.logs.setdefault(tp, [])[offset:]
        self.epochs[tp] = self.epochs.get(tp, 0) + 1

    def end_offset_for(self, tp: TopicPartition, epoch: int) -> int:
        """OffsetForLeaderEpoch: where the log of ``epoch`` ends (the first offset of a later epoch)."""
        log = self.logs.get(tp, [])
        later = [r.offset for r in log if r.leader_epoch > epoch]
        return min(later) if later else len(log)

    def recreate(self, topic: str, topic_id: str) -> None:
        """The topic deleted and created again under its name: every partition's log empty,
        its leader epoch 0 again, a new id."""
        for tp in [tp for tp in self.logs if tp.topic == topic]:
            self.logs[tp] = []
            self.epochs.pop(tp, None)
            self.earliest.pop(tp, None)
            self.open_transactions.pop(tp, None)
        self.topic_ids[topic] = topic_id

    def delete_before(self, tp: TopicPartition, offset: int) -> None:
        self.earliest[tp] = offset

    def high(self, tp: TopicPartition) -> int:
        return len(self.logs.get(tp, []))

    def low(self, tp: TopicPartition) -> int:
        return self.earliest.get(tp, 0)

    def stable(self, tp: TopicPartition) -> int:
        return self.open_transactions.get(tp, self.high(tp))

    def log_end(self, tp: TopicPartition) -> LogEnd:
        return LogEnd(self.stable(tp), self.epochs.get(tp, 0), self.low(tp), self.topic_ids.get(tp.topic))

    def read(self, tp: TopicPartition, start: int, end: int) -> list[MemoryRecord]:
        """What a read_committed reader gets of ``[start, end)``, or DataLoss when offsets of
        it are gone (retention) or beyond the log's stable end."""
        if start < self.low(tp) or end > self.stable(tp):
            raise DataLoss(f"{tp} [{start}, {end}): log holds [{self.low(tp)}, {self.stable(tp)})")
        return [r for r in self.logs.get(tp, [])[start:end] if not r.invisible]


class MemoryLogOffsets:
    """:class:`ingest.consume.log_offsets.LogOffsets` over a broker: every query is answered at
    once, but partitions in ``failing`` (an answer with an error)."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.failing: set[TopicPartition] = set()
        self.queries = 0

    def query(self, tps: Sequence[TopicPartition]) -> _Answered:
        self.queries += 1
        ends = {tp: self.broker.log_end(tp) for tp in tps if tp not in self.failing}
        return _Answered(ends, {tp: "injected failure" for tp in tps if tp in self.failing})

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        if tp in self.failing:
            raise KafkaCallFailed(f"watermarks of {tp}: injected failure")
        return self.broker.low(tp), self.broker.stable(tp)

    def topic_ids(self, topics: Sequence[str], timeout_s: float) -> dict[str, str | None]:
        if any(tp.topic in topics for tp in self.failing):
            raise KafkaCallFailed(f"ids of {', '.join(topics)}: injected failure")
        known = set(self.broker.topic_ids) | {tp.topic for tp in self.broker.logs}
        return {topic: self.broker.topic_ids.get(topic) for topic in topics if topic in known}

    def close(self) -> None:
        return None


@dataclass
class _Answered:
    ends: dict[TopicPartition, LogEnd]
    errors: dict[TopicPartition, str]

    def done(self) -> bool:
        return True

    def wait(self, timeout_s: float) -> bool:
        return True

    def result(self) -> tuple[dict[TopicPartition, LogEnd], dict[TopicPartition, str]]:
        return self.ends, self.errors


class MemoryValidator:
    """:class:`ingest.consume.validator.PositionValidator` over a broker: each validation is
    answered at the next poll, as librdkafka answers it after its OffsetForLeaderEpoch and first
    fetch. ``held``: partitions whose answers wait (a broker that does not answer yet)."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.asked: list[tuple[TopicPartition, int, int]] = []
        self.held: set[TopicPartition] = set()
        self._pending: dict[TopicPartition, tuple[int, int]] = {}

    def validate(self, tp: TopicPartition, offset: int, leader_epoch: int) -> None:
        self.asked.append((tp, offset, leader_epoch))
        self._pending[tp] = (offset, leader_epoch)

    def forget(self, tps: Sequence[TopicPartition] | set[TopicPartition] | list[TopicPartition]) -> None:
        for tp in tps:
            self._pending.pop(tp, None)

    def poll(self) -> list[Validation]:
        answers = []
        for tp, (offset, epoch) in sorted(self._pending.items()):
            if tp in self.held:
                continue
            del self._pending[tp]
            end = self.broker.end_offset_for(tp, epoch)
            if end < offset:
                text = (
                    f"Partition log truncation detected at offset {offset} (leader epoch {epoch}): broker end"
                    f" offset is {end} (offset leader epoch {epoch}). Reset to INVALID.: {TRUNCATION_TEXT}"
                )
                answers.append(Validation(tp, offset, epoch, Verdict.TRUNCATED, Truncation(offset, epoch, end), text))
            elif offset < self.broker.low(tp):
                answers.append(Validation(tp, offset, epoch, Verdict.GONE, text="Broker: Offset out of range"))
            else:
                answers.append(Validation(tp, offset, epoch, Verdict.VALID))
        return answers

    def close(self) -> None:
        return None


class MemoryConsumer:
    def __init__(self, broker: MemoryBroker, *, incremental: bool = True) -> None:
        self.broker = broker
        self._incremental = incremental
        self._listener: RebalanceListener | None = None
        # Where each assigned partition is positioned (assigned or sought).
        self.positions: dict[TopicPartition, int] = {}
        self._events: list[tuple[str, list[TopicPartition]]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.closed = False

    # -- what the test drives --------------------------------------------------------

    def group_assigns(self, *tps: TopicPartition) -> None:
        self._events.append(("assign", list(tps)))

    def group_revokes(self, *tps: TopicPartition) -> None:
        self._events.append(("revoke", list(tps)))

    def group_loses(self, *tps: TopicPartition) -> None:
        self._events.append(("lost", list(tps)))

    def group_rebalances(self, keep: Sequence[TopicPartition]) -> None:
        """A member joined: every assigned partition not in ``keep`` moves to it. Cooperative:
        only those are revoked, then nothing is assigned (an empty assign, as librdkafka calls
        it). Eager: everything is revoked, then ``keep`` assigned again (tests/contract checks
        both against a broker)."""
        assigned = sorted(self.positions)
        if self._incremental:
            self.group_revokes(*(tp for tp in assigned if tp not in keep))
            self.group_assigns()
        else:
            self.group_revokes(*assigned)
            self.group_assigns(*keep)

    # -- ingest.consume.kafka.Consumer --------------------------------------------------------

    @property
    def incremental(self) -> bool:
        return self._incremental

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self._listener = listener

    def poll(self, timeout_s: float) -> Batch:
        while self._events and self._listener is not None:
            kind, tps = self._events.pop(0)
            callback = {
                "assign": self._listener.on_assign,
                "revoke": self._listener.on_revoke,
                "lost": self._listener.on_lost,
            }[kind]
            callback(self, tps)
        batch = Batch()
        return batch

    def _resolve(self, tp: TopicPartition, offset: int) -> int:
        if offset == OFFSET_BEGINNING:
            return self.broker.low(tp)
        if offset == OFFSET_END:
            return self.broker.high(tp)
        return offset

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not self._incremental:
            self.positions.clear()
        for tp, offset in offsets.items():
            self.positions[tp] = self._resolve(tp, offset)

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        for tp in list(self.positions) if not self._incremental else tps:
            self.positions.pop(tp, None)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def close(self) -> None:
        self.closed = True
