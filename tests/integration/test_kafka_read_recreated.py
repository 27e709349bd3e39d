"""Spark's Kafka reader and a topic deleted and re-created under the same name (with real Spark
and Kafka): Spark pools its executors' consumers, and the records they fetched past a task's
range, by group id and partition for the JVM's life, so a read of the new topic under the group
id the old one was read with is served the old log's records at the same offsets. The reader's
group id ends with a digest of the topic ids it read (ingest.builder.kafka_read.ReadTopics): a
split carrying the new topic's id is read by a consumer of its own, from the new log."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from ingest.builder.kafka_read import KafkaReader
from ingest_common.model import TopicPartition
from tests.acceptance.test_recreated_topic import recreate, topic_id
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, split_of, values


def test_a_recreated_topic_is_read_from_its_new_log_never_from_the_old_ones_pooled_records(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce(kafka_bootstrap, tp, values([b"old-%d" % i for i in range(10)]))
    old_id = topic_id(kafka_bootstrap, topic)
    # A group id of this test's own: no other test's pooled consumers.
    kafka = KafkaReader.of(kafka_bootstrap, f"recreated-{uuid.uuid4().hex[:8]}")

    def read(start: int, end: int, split_topic_id: str) -> list[bytes]:
        split = dataclasses.replace(split_of(tp, start, end), topic_id=split_topic_id)
        return [bytes(r["_value"]) for r in kafka.frame(spark, [split]).orderBy("_offset").collect()]

    # The task reads [0, 5); its consumer fetched the log's records past 5 too, and keeps them.
    assert read(0, 5, old_id) == [b"old-%d" % i for i in range(5)]
    recreate(kafka_bootstrap, topic)
    new_id = topic_id(kafka_bootstrap, topic)
    assert new_id != old_id
    produce(kafka_bootstrap, tp, values([b"new-%d" % i for i in range(10)]))
    assert read(5, 10, new_id) == [b"new-%d" % i for i in range(5, 10)]
