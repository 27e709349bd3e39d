"""Published offsets committed to the consumer group: advice only, never in the way."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.consume.group_offsets import GroupOffsets
from ingest.consume.kafka import KafkaCallFailed, commit_callback
from ingest.ops.metrics import Metrics
from ingest_common.model import TopicPartition

P0 = TopicPartition("t", 0)
P1 = TopicPartition("t", 1)


class FakeConsumer:
    def __init__(self, fail: bool = False) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []
        self.fail = fail

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if self.fail:
            raise KafkaCallFailed("Local: No offset stored")
        self.commits.append([(tp.topic, tp.partition, o) for tp, o in sorted(offsets.items())])


def count(metrics: Metrics, result: str) -> float:
    value: Any = metrics.group_commits.labels("s", result)._value.get()
    return float(value)


def test_the_newest_published_offset_of_each_owned_partition_is_committed_once_per_interval() -> None:
    metrics = Metrics("s")
    offsets = GroupOffsets("s", metrics, interval_s=1.0)
    consumer = FakeConsumer()
    offsets.published(P0, 10)
    offsets.published(P0, 25)
    offsets.published(P1, 7)
    offsets.commit_due(consumer, {P0, P1}, now=100.0)
    assert consumer.commits == [[("t", 0, 25), ("t", 1, 7)]]
    offsets.published(P0, 30)
    offsets.commit_due(consumer, {P0, P1}, now=100.5)  # within the interval: later
    offsets.commit_due(consumer, {P0, P1}, now=101.0)
    assert consumer.commits[1:] == [[("t", 0, 30)]]
    offsets.commit_due(consumer, {P0, P1}, now=105.0)  # nothing new: nothing sent
    assert len(consumer.commits) == 2


def test_partitions_that_left_the_worker_are_not_committed() -> None:
    offsets = GroupOffsets("s", Metrics("s"), interval_s=0.0)
    consumer = FakeConsumer()
    offsets.published(P0, 10)
    offsets.published(P1, 10)
    offsets.commit_due(consumer, {P1}, now=1.0)
    assert consumer.commits == [[("t", 1, 10)]]


def test_a_commit_that_fails_is_counted_and_never_raised() -> None:
    metrics = Metrics("s")
    offsets = GroupOffsets("s", metrics, interval_s=0.0)
    offsets.published(P0, 10)
    offsets.commit_due(FakeConsumer(fail=True), {P0}, now=1.0)  # refused at once
    # librdkafka's per-partition result (its TopicPartition's error is read-only from Python).
    failed = SimpleNamespace(topic="t", partition=0, offset=10, error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    on_commit = commit_callback(offsets.committed)  # what the consumer's config registers
    on_commit(None, [failed])  # refused by the broker, reported from poll()
    on_commit(KafkaError(KafkaError._TRANSPORT), [KafkaTopicPartition("t", 0, 10)])
    on_commit(None, [KafkaTopicPartition("t", 0, 10)])
    assert (count(metrics, "failed"), count(metrics, "ok")) == (3.0, 1.0)
