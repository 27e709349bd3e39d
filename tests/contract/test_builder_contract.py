"""One contract for the build stage (ingest.builder.job.SegmentBuilder), run against the fake
builder the unit tests use (tests.fakes.FakeBuilder over the in-memory broker) and the real
one (SparkSegmentBuilder reading a real Apache Kafka broker through Spark): what the unit tests
assume of a build is what Spark's does. A batch gives one result per split, in order; a split's
rows are the records a read_committed reader finds in its range (aborted records and markers
are none); a killed split is SplitKilled and the others are built; offsets gone from the log
fail the split, never a segment with fewer rows; every build is registered before it writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from ingest.builder.job import SegmentBuilder
from ingest.errors import BuildError, SplitKilled
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, TopicPartition
from tests.fakes import FakeBuilder, RecordingRegistrar
from tests.kafka_splits import produce_blocks, spark_builder, split_of
from tests.memory_kafka import MemoryBroker

VALUE = b'{"id": 1, "ts": "2026-11-28T10:00:00Z"}'


@dataclass
class Backend:
    name: str
    topic: str
    builder: SegmentBuilder
    registrar: RecordingRegistrar
    spec: SourceSpec
    # Produce ``n`` records to a partition; the offsets they got (start, end).
    produce: Callable[[int, int], tuple[int, int]]
    # Records of a transaction that is aborted (their marker after them); the offsets it took.
    aborted: Callable[[int, int], tuple[int, int]]
    delete_before: Callable[[int, int], None]

    def tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)


def _spec(tmp_path: Path) -> SourceSpec:
    return spec_from_dict(
        {
            "name": "contract",
            "topics": ["t"],
            "event_time": "ts",
            "segment_store": f"file://{tmp_path}/store",
            "schema": {"id": "long", "ts": "timestamp"},
        }
    )


def _memory(tmp_path: Path) -> Backend:
    broker = MemoryBroker()
    registrar = RecordingRegistrar()
    topic = "t"

    def produce(partition: int, n: int) -> tuple[int, int]:
        tp = TopicPartition(topic, partition)
        start = broker.high(tp)
        broker.produce(tp, *(VALUE for _ in range(n)), key=None)
        return start, broker.high(tp)

    def aborted(partition: int, n: int) -> tuple[int, int]:
        tp = TopicPartition(topic, partition)
        start = broker.high(tp)
        broker.begin_transaction(tp, *(VALUE for _ in range(n)))
        broker.end_transaction(tp, commit=False)
        return start, broker.high(tp)

    builder = FakeBuilder(registrar=registrar, broker=broker)
    return Backend(
        "memory",
        topic,
        builder,
        registrar,
        _spec(tmp_path),
        produce,
        aborted,
        lambda partition, offset: broker.delete_before(TopicPartition(topic, partition), offset),
    )


def _kafka(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    topic: str = request.getfixturevalue("make_topic")(partitions=2)
    registrar = RecordingRegistrar()
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def produce(partition: int, n: int) -> tuple[int, int]:
        [offsets] = produce_blocks(bootstrap, topic, [(partition, [(None, VALUE)] * n)])
        return offsets.start, offsets.end

    def aborted(partition: int, n: int) -> tuple[int, int]:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"contract-{topic}-{partition}"})
        producer.init_transactions(30)
        start = admin.list_topics(topic, timeout=10) and _high(admin, topic, partition)
        producer.begin_transaction()
        for _ in range(n):
            producer.produce(topic, VALUE, partition=partition)
        producer.flush(30)
        producer.abort_transaction(30)
        return start, _high(admin, topic, partition)

    def delete_before(partition: int, offset: int) -> None:
        futures = admin.delete_records([KafkaTopicPartition(topic, partition, offset)], request_timeout=30)
        for future in futures.values():
            future.result(timeout=30)

    spark = request.getfixturevalue("spark")
    yield Backend(
        "kafka",
        topic,
        spark_builder(spark, bootstrap, registrar),
        registrar,
        _spec(tmp_path),
        produce,
        aborted,
        delete_before,
    )


def _high(admin: Any, topic: str, partition: int) -> int:
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    tp = KafkaTopicPartition(topic, partition)
    for _ in range(100):  # the abort's marker is written after abort_transaction returns
        futures = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=10)
        high = int(futures[tp].result(timeout=10).offset)
        stable = int(
            admin.list_offsets(
                {tp: OffsetSpec.latest()},
                isolation_level=__import__("confluent_kafka").IsolationLevel.READ_COMMITTED,
                request_timeout=10,
            )[tp]
            .result(timeout=10)
            .offset
        )
        if stable == high:
            return high
        __import__("time").sleep(0.1)
    raise TimeoutError(f"{topic}[{partition}]: the transaction's marker was not written")


@pytest.fixture(params=["memory", "kafka"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        yield _memory(tmp_path)
    else:
        yield from _kafka(request, tmp_path)


def build(backend: Backend, *splits: SealedSplit) -> list[BuiltSegment | Exception]:
    return backend.builder.build_batch(list(splits), backend.spec)


def test_a_batch_gives_each_split_the_records_in_its_range_in_order(backend: Backend) -> None:
    a = backend.produce(0, 12)
    b = backend.produce(1, 5)
    splits = [
        split_of(backend.tp(0), a[0], a[0] + 7),
        split_of(backend.tp(1), *b),
        split_of(backend.tp(0), a[0] + 7, a[1]),
    ]
    results = build(backend, *splits)
    assert [r.split_id for r in results if isinstance(r, BuiltSegment)] == [s.id for s in splits]
    assert [r.row_count for r in results if isinstance(r, BuiltSegment)] == [7, 5, 5]
    assert all(isinstance(r, BuiltSegment) and r.record_bytes == r.row_count * len(VALUE) for r in results)
    # Registered before it wrote: every split of the batch, in the registrar.
    assert {s.id for s in splits} <= {i for b in backend.registrar.builds for i in b.split_ids}


def test_aborted_records_and_markers_are_in_the_range_and_read_as_none(backend: Backend) -> None:
    before = backend.produce(0, 3)
    gone = backend.aborted(0, 4)
    after = backend.produce(0, 2)
    assert gone[1] - gone[0] == 5  # four aborted records and their marker
    whole, only_aborted = split_of(backend.tp(0), before[0], after[1]), split_of(backend.tp(0), *gone)
    results = build(backend, whole)
    results += build(backend, only_aborted)
    assert [r.row_count for r in results if isinstance(r, BuiltSegment)] == [5, 0]
    assert isinstance(results[1], BuiltSegment) and results[1].files == ()


def test_a_killed_split_is_killed_and_the_others_of_its_batch_are_built(backend: Backend) -> None:
    a = backend.produce(0, 3)
    b = backend.produce(1, 3)
    killed, kept = split_of(backend.tp(0), *a), split_of(backend.tp(1), *b)
    killed.kill_switch.trip("revoke")
    first, second = build(backend, killed, kept)
    assert isinstance(first, SplitKilled) and isinstance(second, BuiltSegment) and second.row_count == 3


def test_offsets_gone_from_the_log_fail_the_split_never_a_shorter_segment(backend: Backend) -> None:
    a = backend.produce(0, 10)
    backend.delete_before(0, a[0] + 4)
    (result,) = build(backend, split_of(backend.tp(0), *a))
    assert isinstance(result, BuildError), result
