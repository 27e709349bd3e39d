"""An in-memory implementation of the worker's Kafka boundary (ingest.consume.kafka.Consumer), for
unit tests: partitions are lists, the test decides when the group assigns, revokes or loses
partitions (the callbacks run inside the next ``poll``, as librdkafka runs them), and
retention can drop a partition's head (a position before it, or past the log end, is refused,
as with ``auto.offset.reset=error``). Records carry the leader epoch they were written under; a
partition's log can be truncated under a new leader epoch, and a position assigned or sought
with a leader epoch is validated as librdkafka does it after a seek (KIP-320): a log of that
epoch ending below the position is reported as a ``Batch.truncated`` with librdkafka's text
(tests/contract/test_kafka_contract.py checks that text against a broker)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

from ingest.consume.kafka import TRUNCATION_TEXT, Batch, KafkaCallFailed, RebalanceListener, Truncation
from ingest.splits.split import SyntheticRecord
from ingest_common.model import TopicPartition


@dataclass
class MemoryBroker:
    logs: dict[TopicPartition, list[SyntheticRecord]] = field(default_factory=dict)
    # The first offset still in each partition's log (retention moved it past what was deleted).
    earliest: dict[TopicPartition, int] = field(default_factory=dict)
    # Each partition's current leader epoch (0 until a truncation).
    epochs: dict[TopicPartition, int] = field(default_factory=dict)

    def produce(self, tp: TopicPartition, *values: bytes) -> None:
        log = self.logs.setdefault(tp, [])
        epoch = self.epochs.get(tp, 0)
        for value in values:
            log.append(SyntheticRecord(len(log), value, topic=tp.topic, partition=tp.partition, leader_epoch=epoch))

    def truncate(self, tp: TopicPartition, offset: int) -> None:
        """An unclean leader election: the new leader's log ends at ``offset``, its epoch is higher."""
        del self.logs.setdefault(tp, [])[offset:]
        self.epochs[tp] = self.epochs.get(tp, 0) + 1

    def end_offset_for(self, tp: TopicPartition, epoch: int) -> int:
        """OffsetForLeaderEpoch: where the log of ``epoch`` ends (the first offset of a later epoch)."""
        log = self.logs.get(tp, [])
        later = [r.offset() for r in log if (r.leader_epoch() or 0) > epoch]
        return min(later) if later else len(log)

    def delete_before(self, tp: TopicPartition, offset: int) -> None:
        self.earliest[tp] = offset

    def high(self, tp: TopicPartition) -> int:
        return len(self.logs.get(tp, []))

    def low(self, tp: TopicPartition) -> int:
        return self.earliest.get(tp, 0)


class MemoryConsumer:
    def __init__(self, broker: MemoryBroker, *, incremental: bool = True) -> None:
        self.broker = broker
        self._incremental = incremental
        self._listener: RebalanceListener | None = None
        self.positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._refused: set[TopicPartition] = set()
        self._events: list[tuple[str, list[TopicPartition]]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.fail_seeks = 0
        self.closed = False
        # Validations asked for by a seek with a leader epoch (librdkafka's): (offset, epoch).
        self._validate: dict[TopicPartition, tuple[int, int]] = {}

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

    def poll(self, max_records: int, timeout_s: float) -> Batch:
        while self._events and self._listener is not None:
            kind, tps = self._events.pop(0)
            callback = {
                "assign": self._listener.on_assign,
                "revoke": self._listener.on_revoke,
                "lost": self._listener.on_lost,
            }[kind]
            callback(self, tps)
        batch = Batch(records=[])
        records: list[SyntheticRecord] = []
        for tp, position in sorted(self.positions.items()):
            if tp in self._paused or tp in self._refused:
                continue
            if tp in self._validate:
                offset, epoch = self._validate.pop(tp)
                end = self.broker.end_offset_for(tp, epoch)
                if end < offset:
                    self._refused.add(tp)
                    text = (
                        f"Partition log truncation detected at offset {offset} (leader epoch {epoch}): broker end"
                        f" offset is {end} (offset leader epoch {epoch}). Reset to INVALID.: {TRUNCATION_TEXT}"
                    )
                    batch.truncated.append((tp, Truncation(offset, epoch, end), text))
                    continue
            # Before the log start (retention) or past its end (an unclean leader election
            # truncated it, the topic was re-created): refused, as librdkafka reports
            # OFFSET_OUT_OF_RANGE under auto.offset.reset=error.
            if not self.broker.low(tp) <= position <= self.broker.high(tp):
                self._refused.add(tp)
                batch.refused.append((tp, position, "Broker: Offset out of range"))
                continue
            log = self.broker.logs.get(tp, [])
            take = log[position : position + max_records - len(records)]
            records.extend(take)
            self.positions[tp] = position + len(take)
            if take and self.positions[tp] == len(log):
                # enable.partition.eof: reported in the same poll, after the records it follows.
                batch.ends.append((tp, len(log)))
        batch.records = records
        return batch

    def _resolve(self, tp: TopicPartition, offset: int) -> int:
        if offset == OFFSET_BEGINNING:
            return self.broker.low(tp)
        if offset == OFFSET_END:
            return self.broker.high(tp)
        return offset

    def assign(
        self, offsets: Mapping[TopicPartition, int], leader_epochs: Mapping[TopicPartition, int] | None = None
    ) -> None:
        if not self._incremental:
            self.positions.clear()
            self._paused.clear()
            self._validate.clear()
        for tp, offset in offsets.items():
            self.positions[tp] = self._resolve(tp, offset)
            self._paused.discard(tp)
            self._refused.discard(tp)
            self._validate.pop(tp, None)
            epoch = (leader_epochs or {}).get(tp)
            if epoch is not None:
                self._validate[tp] = (offset, epoch)  # ConfluentConsumer seeks with it

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        for tp in list(self.positions) if not self._incremental else tps:
            self.positions.pop(tp, None)
            self._validate.pop(tp, None)
            self._paused.discard(tp)
            self._refused.discard(tp)

    def seek(
        self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int], leader_epoch: int | None = None
    ) -> None:
        if self.fail_seeks > 0:
            self.fail_seeks -= 1
            raise KafkaCallFailed(f"seek {tp}: injected")
        if tp not in self.positions:
            raise KafkaCallFailed(f"seek {tp}: not assigned")
        self.seeks.append((tp, offset))
        self.positions[tp] = self._resolve(tp, offset)
        self._refused.discard(tp)
        self._validate.pop(tp, None)
        if leader_epoch is not None:
            self._validate[tp] = (offset, leader_epoch)

    def set_paused(self, wanted: Iterable[TopicPartition]) -> None:
        self._paused = set(wanted) & set(self.positions)

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def high_watermark(self, tp: TopicPartition) -> int | None:
        return self.broker.high(tp) if tp in self.broker.logs else None

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        return self.broker.low(tp), self.broker.high(tp)

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def close(self) -> None:
        self.closed = True
