"""One contract for the worker's Kafka boundary (ingest.consume.kafka.Consumer), run against the
in-memory consumer the unit tests use (tests.memory_kafka) and confluent-kafka on a real
Apache Kafka broker: what the unit tests assume of a consumer is what the real one does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import Batch, ConfluentConsumer, Consumer
from ingest_common.model import TopicPartition
from tests.memory_kafka import MemoryBroker, MemoryConsumer


@dataclass
class Backend:
    consumer: Consumer
    tp: TopicPartition
    produce: Callable[[int], object]
    delete_before: Callable[[int], None]


def _memory() -> Iterator[Backend]:
    broker = MemoryBroker()
    tp = TopicPartition("t", 0)
    yield Backend(
        MemoryConsumer(broker),
        tp,
        lambda n: broker.produce(tp, *(str(i).encode() for i in range(n))),
        lambda offset: broker.delete_before(tp, offset),
    )


def _kafka(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from ingest_dev.kafka_clients import produce_records

    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    topic = request.getfixturevalue("make_topic")(partitions=1)
    tp = TopicPartition(topic, 0)
    conf = {**PROTOCOL_PROPERTIES, "bootstrap.servers": bootstrap, "group.id": f"contract-{uuid.uuid4().hex[:8]}"}
    consumer = ConfluentConsumer(KafkaConsumer(conf), incremental=True)

    def delete_before(offset: int) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.delete_records([KafkaTopicPartition(topic, 0, offset)], request_timeout=30)
        for future in futures.values():
            future.result(timeout=30)

    yield Backend(
        consumer,
        tp,
        lambda n: produce_records(bootstrap, topic, ((0, None, str(i).encode()) for i in range(n))),
        delete_before,
    )
    consumer.close()


@pytest.fixture(params=["memory", "kafka"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from (_memory() if request.param == "memory" else _kafka(request))


def poll_until(consumer: Consumer, done: Callable[[list[Any], Batch], bool], timeout_s: float = 20.0) -> list[Any]:
    """Poll, collecting records, until ``done(records so far, last batch)``."""
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while True:
        batch = consumer.poll(500, 0.1)
        records.extend(batch.records)
        if done(records, batch):
            return records
        assert time.monotonic() < deadline, f"gave up with {len(records)} records"


def offsets(records: list[Any]) -> list[int]:
    return [r.offset() for r in records]


def test_records_come_in_order_from_the_assigned_offset(backend: Backend) -> None:
    backend.produce(30)
    backend.consumer.assign({backend.tp: 10})
    got = poll_until(backend.consumer, lambda rs, _b: len(rs) >= 20)
    assert offsets(got) == list(range(10, 30))
    assert {(r.topic(), r.partition()) for r in got} == {(backend.tp.topic, 0)} and all(len(r) > 0 for r in got)
    assert backend.consumer.watermarks(backend.tp, 10.0) == (0, 30)


def test_a_seek_delivers_again_from_the_new_offset(backend: Backend) -> None:
    backend.produce(20)
    backend.consumer.assign({backend.tp: 0})
    poll_until(backend.consumer, lambda rs, _b: len(rs) >= 20)
    backend.consumer.seek(backend.tp, 5, {backend.tp: 5})
    again = poll_until(backend.consumer, lambda rs, _b: len(rs) >= 15)
    assert offsets(again) == list(range(5, 20))


def test_a_paused_partition_delivers_nothing_until_resumed(backend: Backend) -> None:
    backend.produce(5)
    backend.consumer.assign({backend.tp: 0})
    backend.consumer.set_paused([backend.tp])
    assert backend.consumer.paused() == frozenset({backend.tp})
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert list(backend.consumer.poll(500, 0.1).records) == []
    backend.consumer.set_paused([])
    assert offsets(poll_until(backend.consumer, lambda rs, _b: len(rs) >= 5)) == list(range(5))


def test_an_offset_no_longer_in_the_log_is_refused_and_a_seek_past_it_recovers(backend: Backend) -> None:
    backend.produce(20)
    backend.delete_before(8)
    backend.consumer.assign({backend.tp: 2})
    poll_until(backend.consumer, lambda _rs, b: bool(b.refused))
    low, high = backend.consumer.watermarks(backend.tp, 10.0)
    assert (low, high) == (8, 20)
    # librdkafka stops the partition's fetcher after the refusal; the boundary restarts it.
    backend.consumer.seek(backend.tp, low, {backend.tp: low})
    assert offsets(poll_until(backend.consumer, lambda rs, _b: len(rs) >= 12)) == list(range(8, 20))


def test_an_offset_past_the_log_end_is_refused_and_nothing_is_read_from_elsewhere(backend: Backend) -> None:
    """The stored offset is above the log end after an unclean leader election truncated the
    log (or the topic was re-created): librdkafka reports OFFSET_OUT_OF_RANGE as a refusal of
    that offset (auto.offset.reset=error), and delivers no record from another position."""
    backend.produce(10)
    backend.consumer.assign({backend.tp: 50})
    refused: list[tuple[TopicPartition, int | None, str]] = []

    def done(_records: list[Any], batch: Batch) -> bool:
        refused.extend(batch.refused)
        return bool(refused)

    assert poll_until(backend.consumer, done) == []
    assert [(tp, offset) for tp, offset, _text in refused] == [(backend.tp, 50)]
    assert "out of range" in refused[0][2].lower()
    assert backend.consumer.watermarks(backend.tp, 10.0) == (0, 10)


def test_unassigning_stops_delivery_and_forgets_the_pause(backend: Backend) -> None:
    backend.produce(3)
    backend.consumer.assign({backend.tp: 0})
    backend.consumer.set_paused([backend.tp])
    backend.consumer.unassign([backend.tp])
    assert backend.consumer.paused() == frozenset()
    assert list(backend.consumer.poll(500, 0.5).records) == []
