"""One contract for the worker's Kafka boundary (ingest.consume.kafka.Consumer), run against the
in-memory consumer the unit tests use (tests.memory_kafka) and confluent-kafka on a real
Apache Kafka broker (tests/contract/conftest.py): what the unit tests assume of a consumer is
what the real one does. Here: positions (assign, seek, pause, refusals) under cooperative and
eager assignment; the group (rebalance callbacks, commits) is test_kafka_group_contract.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ingest.consume.kafka import Batch, Consumer
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.contract.conftest import Backend


def poll_until(consumer: Consumer, done: Callable[[list[Any], Batch], bool], timeout_s: float = 20.0) -> list[Any]:
    """Poll, collecting records, until ``done(records so far, last batch)``."""
    records: list[Any] = []

    def polled() -> bool:
        batch = consumer.poll(500, 0.1)
        records.extend(batch.records)
        return done(records, batch)

    wait_until(polled, timeout_s, "the records", interval=0, detail=lambda: f"gave up with {len(records)} records")
    return records


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


def by_partition(records: list[Any]) -> dict[TopicPartition, list[int]]:
    out: dict[TopicPartition, list[int]] = {}
    for r in records:
        out.setdefault(TopicPartition(r.topic(), r.partition()), []).append(r.offset())
    return out


def test_a_paused_partition_delivers_nothing_until_resumed_while_the_others_deliver(backend: Backend) -> None:
    backend.produce_to(backend.tp, 5)
    backend.produce_to(backend.other, 5)
    backend.consumer.assign({backend.tp: 0, backend.other: 0})
    backend.consumer.set_paused([backend.tp])
    assert backend.consumer.paused() == frozenset({backend.tp})
    # The other partition's records must come; none of the paused one's come with them.
    got = poll_until(backend.consumer, lambda rs, _b: len(rs) >= 5)
    assert by_partition(got) == {backend.other: list(range(5))}
    backend.consumer.set_paused([])
    assert backend.consumer.paused() == frozenset()
    resumed = poll_until(backend.consumer, lambda rs, _b: len(rs) >= 5)
    assert by_partition(resumed) == {backend.tp: list(range(5))}


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


@pytest.mark.parametrize("incremental", [True, False], ids=["cooperative", "eager"])
def test_unassigning_stops_delivery_and_forgets_the_pause(backend: Backend, incremental: bool) -> None:
    consumer = backend.make_consumer(incremental)
    backend.produce(3)
    consumer.assign({backend.tp: 0})
    consumer.set_paused([backend.tp])
    consumer.unassign([backend.tp])
    assert consumer.paused() == frozenset()
    assert list(consumer.poll(500, 0.5).records) == []
    # Assigned again, it delivers from its new offset.
    consumer.assign({backend.tp: 1})
    assert offsets(poll_until(consumer, lambda rs, _b: len(rs) >= 2)) == [1, 2]


@pytest.mark.parametrize("incremental", [True, False], ids=["cooperative", "eager"])
def test_an_eager_assign_replaces_the_assignment_and_a_cooperative_one_adds_to_it(
    backend: Backend, incremental: bool
) -> None:
    consumer = backend.make_consumer(incremental)
    assert consumer.incremental is incremental
    backend.produce_to(backend.tp, 3)
    backend.produce_to(backend.other, 3)
    consumer.assign({backend.tp: 0})
    consumer.assign({backend.other: 1})
    if incremental:
        got = poll_until(consumer, lambda rs, _b: len(rs) >= 5)
        assert by_partition(got) == {backend.tp: [0, 1, 2], backend.other: [1, 2]}
    else:
        got = poll_until(consumer, lambda rs, _b: len(rs) >= 2)
        assert by_partition(got) == {backend.other: [1, 2]}


@pytest.mark.parametrize("incremental", [True, False], ids=["cooperative", "eager"])
def test_a_seek_that_restarts_a_refused_partition_leaves_the_others_where_they_were(
    backend: Backend, incremental: bool
) -> None:
    """After a refusal the boundary re-assigns the partition to restart its fetcher; under
    eager assignment that replaces the whole assignment, so the other partitions must be
    re-assigned where the consumer reached: nothing of theirs skipped or delivered twice."""
    consumer = backend.make_consumer(incremental)
    backend.produce_to(backend.tp, 20)
    backend.delete_before(8)
    backend.produce_to(backend.other, 6)
    consumer.assign({backend.tp: 2, backend.other: 0})
    refused: list[tuple[TopicPartition, int | None, str]] = []

    def refused_and_read(records: list[Any], batch: Batch) -> bool:
        refused.extend(batch.refused)
        return bool(refused) and len(records) >= 6

    seen = poll_until(consumer, refused_and_read)
    assert by_partition(seen) == {backend.other: list(range(6))}
    consumer.seek(backend.tp, 8, {backend.tp: 8, backend.other: 6})
    backend.produce_to(backend.other, 2)
    after = poll_until(consumer, lambda rs, _b: len(rs) >= 14)
    assert by_partition(after) == {backend.tp: list(range(8, 20)), backend.other: [6, 7]}
