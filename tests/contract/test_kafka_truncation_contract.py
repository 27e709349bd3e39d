"""KIP-320 as the worker's Kafka boundary sees it, against the in-memory consumer the unit tests
use (tests.memory_kafka) and confluent-kafka on a real Apache Kafka broker whose partition log
was lost (ingest_dev.kafka.LocalKafka.lose_partition_log) and then grew past the position
again: assigned with the leader epoch stored with the position, the consumer reports the
truncation (librdkafka: _AUTO_OFFSET_RESET under auto.offset.reset=error, with its
_LOG_TRUNCATION text) and delivers nothing; assigned without it, it reads on silently, which is
the loss this detection closes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer

from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import Batch, ConfluentConsumer, Consumer, Truncation
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.memory_kafka import MemoryBroker, MemoryConsumer

STORED = 15  # published up to here, from records of the first leader epoch
BEFORE, AFTER = 20, 30  # records before the log was lost, and produced after


@dataclass
class Truncated:
    """A partition whose log was lost after ``BEFORE`` records and holds ``AFTER`` others now."""

    tp: TopicPartition
    epoch_before: int
    epoch_after: int
    make_consumer: Callable[[], Consumer]


class Assigner:
    """Assigns every partition the group gives it at ``STORED``, with ``epoch`` if given."""

    def __init__(self, epoch: int | None) -> None:
        self.epoch = epoch

    def on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.assign({tp: STORED for tp in tps}, {tp: self.epoch for tp in tps} if self.epoch is not None else None)

    def on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.unassign(tps)

    def on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.unassign(tps)


def _memory() -> Truncated:
    broker, tp = MemoryBroker(), TopicPartition("t", 0)
    broker.produce(tp, *(b"%d" % i for i in range(BEFORE)))
    broker.truncate(tp, 0)
    broker.produce(tp, *(b"%d" % i for i in range(AFTER)))

    def make() -> Consumer:
        consumer = MemoryConsumer(broker)
        consumer.group_assigns(tp)  # at its first poll, as the group would
        return consumer

    return Truncated(tp, 0, broker.epochs[tp], make)


@dataclass(frozen=True)
class TruncatedLog:
    """The truncated partition on a broker of this module's own."""

    bootstrap: str
    tp: TopicPartition
    epoch_before: int
    epoch_after: int


@pytest.fixture(scope="module")
def truncated_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TruncatedLog]:
    """One broker and one truncated partition for every test of the module (a broker of its own
    and the log's loss cost ~20 s): the tests only read the partition, each in a consumer group
    of its own that commits nothing (enable.auto.commit=false), so none sees another's traces.
    Started like ``private_kafka`` (tests/fixtures/servers.py), which is per test."""
    from ingest_dev.kafka import LocalKafka
    from ingest_dev.kafka_clients import create_topic, produce_records, record_leader_epochs

    broker = LocalKafka(base_dir=tmp_path_factory.mktemp("truncation") / "kafka")
    broker.start()
    try:
        bootstrap, topic = broker.bootstrap, f"trunc-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 1)
        produce_records(bootstrap, topic, ((0, b"k", b"%d" % i) for i in range(BEFORE)))
        [before] = record_leader_epochs(bootstrap, topic, 0)
        broker.lose_partition_log(topic, 0)
        produce_records(bootstrap, topic, ((0, b"k", b"%d" % i) for i in range(AFTER)))
        [after] = record_leader_epochs(bootstrap, topic, 0)
        yield TruncatedLog(bootstrap, TopicPartition(topic, 0), before, after)
    finally:
        broker.stop()


def _kafka(log: TruncatedLog) -> Iterator[Truncated]:
    consumers: list[ConfluentConsumer] = []

    def make() -> Consumer:
        conf: dict[str, Any] = {
            **PROTOCOL_PROPERTIES,
            "bootstrap.servers": log.bootstrap,
            "group.id": f"contract-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000,
            "partition.assignment.strategy": "cooperative-sticky",
        }
        consumer = ConfluentConsumer(KafkaConsumer(conf), incremental=True)
        consumers.append(consumer)
        return consumer

    yield Truncated(log.tp, log.epoch_before, log.epoch_after, make)
    for consumer in consumers:
        consumer.close()


@pytest.fixture(params=["memory", "kafka"])
def truncated(request: pytest.FixtureRequest) -> Iterator[Truncated]:
    if request.param == "memory":
        yield _memory()
    else:
        yield from _kafka(request.getfixturevalue("truncated_log"))


def _poll(consumer: Consumer, done: Callable[[list[Any], Batch], bool]) -> tuple[list[Any], list[Batch]]:
    records: list[Any] = []
    batches: list[Batch] = []

    def polled() -> bool:
        batch = consumer.poll(500, 0.2)
        records.extend(batch.records)
        batches.append(batch)
        return done(records, batch)

    wait_until(polled, 90, "the consumer's answer", interval=0, detail=lambda: f"{len(records)} records")
    return records, batches


def test_a_position_assigned_with_its_leader_epoch_reports_the_truncation_and_delivers_nothing(
    truncated: Truncated,
) -> None:
    assert truncated.epoch_after > truncated.epoch_before  # the lost log came back under a new leader
    consumer = truncated.make_consumer()
    consumer.subscribe([truncated.tp.topic], Assigner(truncated.epoch_before))
    records, batches = _poll(consumer, lambda _r, batch: bool(batch.truncated or batch.refused))
    assert records == [] and [b.refused for b in batches if b.refused] == []
    [(tp, truncation, text)] = [t for b in batches for t in b.truncated]
    # The whole log of the first epoch is gone: the broker's log of it ends at 0.
    assert (tp, truncation) == (truncated.tp, Truncation(STORED, truncated.epoch_before, 0))
    assert Truncation.parse(text) == truncation


def test_a_position_assigned_without_a_leader_epoch_reads_the_new_records_silently(truncated: Truncated) -> None:
    consumer = truncated.make_consumer()
    consumer.subscribe([truncated.tp.topic], Assigner(None))
    records, batches = _poll(consumer, lambda records, _b: len(records) >= AFTER - STORED)
    assert [r.offset() for r in records] == list(range(STORED, AFTER))
    assert {r.leader_epoch() for r in records} == {truncated.epoch_after}
    assert not any(b.truncated or b.refused for b in batches)
