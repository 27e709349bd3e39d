"""An in-memory implementation of the worker's Kafka boundary (ingest.consume.kafka.Consumer), for
unit tests: partitions are lists, the test decides when the group assigns, revokes or loses
partitions (the callbacks run inside the next ``poll``, as librdkafka runs them), and
retention can drop a partition's head (a position before it, or past the log end, is refused,
as with ``auto.offset.reset=error``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

from ingest.build.split import SyntheticRecord
from ingest.consume.kafka import Batch, KafkaCallFailed, RebalanceListener
from ingest_common.model import TopicPartition


@dataclass
class MemoryBroker:
    logs: dict[TopicPartition, list[SyntheticRecord]] = field(default_factory=dict)
    # The first offset still in each partition's log (retention moved it past what was deleted).
    earliest: dict[TopicPartition, int] = field(default_factory=dict)

    def produce(self, tp: TopicPartition, *values: bytes) -> None:
        log = self.logs.setdefault(tp, [])
        for value in values:
            log.append(SyntheticRecord(len(log), value, topic=tp.topic, partition=tp.partition))

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

    def assign(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not self._incremental:
            self.positions.clear()
            self._paused.clear()
        for tp, offset in offsets.items():
            self.positions[tp] = self._resolve(tp, offset)
            self._paused.discard(tp)
            self._refused.discard(tp)

    def unassign(self, tps: Sequence[TopicPartition]) -> None:
        for tp in list(self.positions) if not self._incremental else tps:
            self.positions.pop(tp, None)
            self._paused.discard(tp)
            self._refused.discard(tp)

    def seek(self, tp: TopicPartition, offset: int, others: Mapping[TopicPartition, int]) -> None:
        if self.fail_seeks > 0:
            self.fail_seeks -= 1
            raise KafkaCallFailed(f"seek {tp}: injected")
        if tp not in self.positions:
            raise KafkaCallFailed(f"seek {tp}: not assigned")
        self.seeks.append((tp, offset))
        self.positions[tp] = self._resolve(tp, offset)
        self._refused.discard(tp)

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
