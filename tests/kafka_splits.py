"""Records produced to a real Kafka topic and sealed splits over their offsets, for the build
stage's tests (the builder reads each split's range from Kafka: ingest.builder.kafka_read).

Records go out through one producer per call, in the order given, one request in flight at a
time (a retry cannot reorder them), so each block of records gets consecutive offsets and no
control record lies between them. Not idempotent: its producer id costs half a second per call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ingest.builder.job import SparkSegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.builder.registration import BuildRegistrar
from ingest.splits.kill_switch import KillSwitch
from ingest.splits.split import SealedSplit
from ingest_common.model import OffsetRange, TopicPartition
from ingest_dev.kafka_clients import produce_records

# A record as produced: (key, value).
Record = tuple[bytes | None, bytes | None]

#: The group id of the tests' Spark Kafka reads (it names Spark's consumer pool; never joined).
READER_GROUP_ID = "ingest-tests-spark"

_IN_ORDER = {"max.in.flight.requests.per.connection": 1}


def split_of(
    tp: TopicPartition, start: int, end: int, leader_epoch: int | None = None, *, serial: int = 1, epoch: int = 0
) -> SealedSplit:
    """A sealed split of ``tp``'s offsets ``[start, end)``, with a kill switch of its own."""
    now = time.monotonic()
    return SealedSplit(
        id=uuid.uuid4(),
        tp=tp,
        serial=serial,
        start=start,
        end=end,
        leader_epoch=leader_epoch,
        estimated_bytes=0,
        available_at=now,
        sealed_at=now,
        seal_reason="test",
        kill_switch=KillSwitch(),
        epoch=epoch,
    )


def split_over(offsets: OffsetRange) -> SealedSplit:
    """A sealed split of the offsets a produce gave."""
    return split_of(offsets.tp, offsets.start, offsets.end)


def produce_blocks(bootstrap: str, topic: str, blocks: Sequence[tuple[int, Sequence[Record]]]) -> list[OffsetRange]:
    """Produce each block of records to its partition (one producer for all), in order; the
    offsets each block got. The partitions must have no other writer meanwhile: a partition's
    records end where its log ends, consecutive from there back."""
    ends = produce_records(
        bootstrap,
        topic,
        ((partition, key, value) for partition, records in blocks for key, value in records),
        config=_IN_ORDER,
    )
    at = dict(ends)
    ranges = []
    for partition, records in reversed(blocks):
        at[partition] -= len(records)
        ranges.append(OffsetRange(TopicPartition(topic, partition), at[partition], at[partition] + len(records)))
    return ranges[::-1]


def produce(bootstrap: str, tp: TopicPartition, records: Sequence[Record]) -> OffsetRange:
    """Produce ``records`` to ``tp``; the offsets they got."""
    [offsets] = produce_blocks(bootstrap, tp.topic, [(tp.partition, records)])
    return offsets


def values(values: Sequence[bytes | None]) -> list[Record]:
    """Records of these values, without keys."""
    return [(None, value) for value in values]


def reader(bootstrap: str) -> KafkaReader:
    """The reader of the tests' builders."""
    return KafkaReader.of(bootstrap, READER_GROUP_ID)


def spark_builder(spark: Any, bootstrap: str, registrar: BuildRegistrar, **options: Any) -> SparkSegmentBuilder:
    """The builder a worker makes, reading from ``bootstrap`` (``options``: the builder's own)."""
    return SparkSegmentBuilder(spark, registrar, reader(bootstrap), **options)
