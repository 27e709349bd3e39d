"""The byte count that bounds a worker's memory (``max_bytes``, ``max_in_flight_bytes``) against
what records consumed from a real broker hold: tracemalloc measures the Python memory a sealed
split's records take, and the split's ``size_bytes`` must match it however small the values,
whatever the keys and headers."""

from __future__ import annotations

import gc
import tracemalloc
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer

from ingest.build.split import PartitionBuffer, SealedSplit
from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import ConfluentConsumer
from ingest.spec import SplitLimits
from ingest_common.model import TopicPartition

RECORDS = 5000
UNBOUNDED = SplitLimits(max_records=10**9, max_bytes=10**18, max_age_s=3600.0)
# How far the count may be from the measured growth: the buffer's list over-allocates a
# little, and the batches' lists come and go.
TOLERANCE = 0.02

Headers = list[tuple[str, bytes | None]] | None


def _produce(bootstrap: str, topic: str, key: bytes | None, value: bytes, headers: Headers) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failures: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for _ in range(RECORDS):
        producer.produce(topic, value=value, key=key, headers=headers, partition=0, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failures, failures


def _buffered_split(bootstrap: str, topic: str) -> SealedSplit:
    """Every record of the topic's partition 0, through the consumer loop's path (the
    project's consumer, ``PartitionBuffer.take``), sealed as one split."""
    conf = {**PROTOCOL_PROPERTIES, "bootstrap.servers": bootstrap, "group.id": f"mem-{uuid.uuid4().hex[:8]}"}
    consumer = ConfluentConsumer(KafkaConsumer(conf), incremental=True)
    tp = TopicPartition(topic, 0)
    try:
        consumer.assign({tp: 0})
        buf = PartitionBuffer(tp, serial=1, position=0)
        for _ in range(600):  # bounded: 60 s of 0.1 s polls
            batch = consumer.poll(2000, 0.1)
            if batch.records:
                buf.take(batch.records, 0, len(batch.records), 0.0, UNBOUNDED)
            if len(buf) >= RECORDS:
                break
        assert len(buf) == RECORDS, f"consumed {len(buf)} of {RECORDS}"
        return buf.seal("records")
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"k" * 100, b"v" * 10, None),  # small values, large keys: values are 3% of what is held
        (None, b"v" * 10, [("trace-id", b"t" * 32), ("tenant", b"acme"), ("empty", None)]),
        (b"k" * 8, b"v" * 1000, None),
    ],
    ids=["key100-value10", "headers", "value1000"],
)
def test_a_splits_byte_count_is_what_its_records_hold(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    key: bytes | None,
    value: bytes,
    headers: Headers,
) -> None:
    topic = make_topic(partitions=1)
    _produce(kafka_bootstrap, topic, key, value, headers)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        split = _buffered_split(kafka_bootstrap, topic)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(split) == RECORDS
    assert abs(split.size_bytes - held) <= TOLERANCE * held, (
        f"counted {split.size_bytes / RECORDS:.1f} bytes per record, tracemalloc measured {held / RECORDS:.1f}"
    )
