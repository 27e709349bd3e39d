"""The byte count that bounds a worker's memory (``max_bytes``, ``max_in_flight_bytes``) against
what records consumed from a real broker hold: tracemalloc (Python's objects) and Arrow's
memory pool (the chunks' columns) measure what a sealed split's records take, and the split's
``size_bytes`` must match it however small the values, whatever the keys and headers (which
are not kept: nothing reads them)."""

from __future__ import annotations

import gc
import tracemalloc
import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer

from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import ConfluentConsumer
from ingest.consume.loop import partition_runs
from ingest.spec import SplitLimits
from ingest.splits.chunks import CHUNK_BYTES, Chunk, chunks_of
from ingest.splits.split import PartitionBuffer, SealedSplit, SyntheticRecord
from ingest_common.model import TopicPartition

RECORDS = 5000
UNBOUNDED = SplitLimits(max_records=10**9, max_bytes=10**18, max_age_s=3600.0)
# How far the count may be from the measured growth: 2 %, and per chunk the part of
# CHUNK_BYTES neither measure sees (the C++ objects of a chunk, malloc's own).
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
    project's consumer, its runs made chunks, ``PartitionBuffer.take``), sealed as one split;
    each poll's messages dropped before the next, as the loop drops them."""
    conf = {**PROTOCOL_PROPERTIES, "bootstrap.servers": bootstrap, "group.id": f"mem-{uuid.uuid4().hex[:8]}"}
    consumer = ConfluentConsumer(KafkaConsumer(conf), incremental=True)
    tp = TopicPartition(topic, 0)
    try:
        consumer.assign({tp: 0})
        buf = PartitionBuffer(tp, serial=1, position=0)
        for _ in range(600):  # bounded: 60 s of 0.1 s polls
            for _topic, _partition, run in partition_runs(consumer.poll(2000, 0.1).records):
                for chunk in chunks_of(run):
                    rest: Chunk | None = chunk
                    while rest is not None:
                        rest, _, _ = buf.take(rest, 0.0, UNBOUNDED)
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
    # The modules the chunks' first use imports (pyarrow's and numpy's) are not records.
    warm = PartitionBuffer(TopicPartition(topic, 0), serial=1, position=0)
    for chunk in chunks_of([SyntheticRecord(o) for o in range(3)]):
        warm.take(chunk, 0.0, SplitLimits(max_records=2, max_bytes=10**9, max_age_s=60.0))
    del warm
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes()
        split = _buffered_split(kafka_bootstrap, topic)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes() - before
    finally:
        tracemalloc.stop()
    assert len(split) == RECORDS
    unseen = CHUNK_BYTES * len(split.chunks)
    assert held <= split.size_bytes <= held + TOLERANCE * held + unseen, (
        f"counted {split.size_bytes / RECORDS:.1f} bytes per record, measured {held / RECORDS:.1f}"
    )
