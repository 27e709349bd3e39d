"""A topic deleted and re-created under the same name (KIP-516 topic ids, migrations/0027),
against the in-memory broker and metastore: the new log's offsets and leader epochs start again
where the old one's did, so only the topic's id tells them apart. Whether the worker finds it at
a claim or from a log-end answer while it runs, the partition stops with both ids recorded and
nothing is cut from the new log; a reset resumes it there; an id not stored yet is recorded."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from ingest.builder.kafka_read import KafkaReader
from ingest.consume.assignment import PartitionState
from ingest.consume.kafka import KafkaCallFailed
from ingest.splits.split import SealedSplit
from ingest_common.model import TopicPartition
from tests.fakes import make_split
from tests.loop_harness import P0, TOPIC, Harness

OLD, NEW = "oldTopicIdAAAAAAAAAAAA", "newTopicIdBBBBBBBBBBBB"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.broker.topic_ids[TOPIC] = OLD
    yield harness
    harness.close()


def built_splits(h: Harness) -> list[SealedSplit]:
    """Every split the builder is given from now on, in order."""
    built: list[SealedSplit] = []
    build = h.builder.build_batch

    def recording(splits: Sequence[SealedSplit], spec: Any) -> Any:
        built.extend(splits)
        return build(splits, spec)

    h.builder.build_batch = recording  # type: ignore[method-assign]
    return built


def split_of(tp: TopicPartition, start: int, end: int, topic_id: str | None = None) -> SealedSplit:
    return dataclasses.replace(make_split(tp, start, end), topic_id=topic_id)


def stopped(h: Harness) -> bool:
    owned = h.assignment.get(P0)
    return owned is not None and owned.state is PartitionState.OUT_OF_RANGE and not owned.gap_pending


def test_the_claim_records_the_topic_id_and_splits_carry_it(h: Harness) -> None:
    built = built_splits(h)
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    assert h.store.topic_ids[P0] == OLD
    assert [s.topic_id for s in built] == [OLD]


def test_a_topic_recreated_under_a_running_worker_stops_the_partition_with_both_ids(h: Harness) -> None:
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
    h.broker.recreate(TOPIC, NEW)
    h.produce(P0, 30)  # the new log grows past the stored offset, under leader epoch 0 again
    h.step_until(lambda: stopped(h), what="the partition stopped")
    assert h.store.recreations == [(P0, 0, 20, OLD, NEW)]
    [(kind, message)] = h.store.errors
    assert kind == "TOPIC_RECREATED"
    assert f"Kafka's topic id is {NEW}, the stored offset 20 was read from topic id {OLD}" in message
    for _ in range(20):
        h.loop.step()
    # Nothing of the new log was cut, nothing skipped: the stored offset and id stay.
    assert h.published(P0) == [(0, 10), (10, 20)] and len(h.builder.started) == 2
    assert h.store.next_offsets[P0] == 20 and h.store.topic_ids[P0] == OLD
    assert h.store.gaps == [] and h.store.truncations == []


def test_a_topic_recreated_while_no_worker_ran_is_stopped_at_the_claim_and_a_reset_reads_the_new_one(
    h: Harness,
) -> None:
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
    h.consumer.group_revokes(P0)
    h.step_until(lambda: h.assignment.get(P0) is None, what="revoked")
    h.broker.recreate(TOPIC, NEW)
    h.produce(P0, 30)
    asked = len(h.validator.asked)
    built = built_splits(h)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: stopped(h), what="the partition stopped")
    assert h.store.recreations == [(P0, 0, 20, OLD, NEW)]
    assert len(h.validator.asked) == asked  # stopped before its position was validated
    for _ in range(20):
        h.loop.step()
    assert built == []

    h.store.reset(P0, 0, topic_id=NEW)  # `ingest reset --to earliest`: the new topic's id with it
    h.step_until(lambda: h.store.next_offsets[P0] == 30, what="the new topic read")
    assert h.published(P0)[2:] == [(0, 10), (10, 20), (20, 30)]
    assert h.store.topic_ids[P0] == NEW and h.store.recreations == [(P0, 0, 20, OLD, NEW)]
    assert {s.topic_id for s in built} == {NEW}


def test_an_id_not_stored_yet_is_recorded_from_the_log_end_answer_before_anything_is_cut(h: Harness) -> None:
    """A row of an earlier release (no id) claimed while Kafka does not give ids: the first
    log-end answer's id is recorded (serial-guarded) and cutting goes on from the stored offset."""
    h.produce(P0, 20)
    with h.store.lock:
        h.store.next_offsets[P0] = 5
    ids = h.offsets.topic_ids

    def not_now(topics: list[str], timeout_s: float) -> dict[str, str | None]:
        h.offsets.topic_ids = ids  # type: ignore[method-assign]
        raise KafkaCallFailed("no answer")

    h.offsets.topic_ids = not_now  # type: ignore[method-assign]
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(5, 15)], what="cut once the id was recorded")
    assert h.store.topic_ids[P0] == OLD and h.store.recreations == [] and h.store.errors == []


def test_at_stored_offset_0_a_recreated_topic_is_read_from_its_start(h: Harness) -> None:
    """Nothing of either log lies below offset 0: the new id is recorded, nothing is stopped."""
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.store.topic_ids.get(P0) == OLD and h.store.next_offsets[P0] == 0, what="claimed")
    h.broker.recreate(TOPIC, NEW)
    h.produce(P0, 10)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the new topic read")
    assert h.store.topic_ids[P0] == NEW and h.store.recreations == [] and h.store.errors == []


def test_the_spark_readers_group_id_changes_with_a_new_topic_id_only() -> None:
    """Spark pools its Kafka consumers and their fetched records by group id and partition: a
    re-created topic read under the old one's group id could be served the old log's records."""
    reader = KafkaReader.of("b:9092", "ingest-src-spark")
    old = [split_of(P0, 0, 10, topic_id=OLD)]
    first = reader.topics.group_id("g", old)
    assert first.startswith("g-") and reader.topics.group_id("g", old) == first
    other = [split_of(TopicPartition("u", 0), 0, 10, topic_id="otherTopicIdCCCCCCCCCC")]
    both = reader.topics.group_id("g", other)
    assert both != first and reader.topics.group_id("g", old) == both  # stable once seen
    assert reader.topics.group_id("g", [split_of(P0, 10, 20, topic_id=NEW)]) not in (first, both)
    assert KafkaReader.of("b:9092", "ingest-src-spark").topics.group_id("g", [split_of(P0, 0, 1)]) == "g"
    # A worker tells its reader every topic's id at start: its reads share one group id from the first.
    seeded = KafkaReader.of("b:9092", "ingest-src-spark")
    seeded.topics.know({TOPIC: OLD, "u": "otherTopicIdCCCCCCCCCC"})
    assert seeded.topics.group_id("g", old) == both
