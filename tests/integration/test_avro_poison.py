"""Avro values and keys whose lengths lie, against a real registry, Kafka and Spark: a string,
a ``bytes`` field (read as a string column) and an array block count each claiming 2^31 - 9
(Avro's own cap), followed by two bytes. Avro's BinaryDecoder allocates the claimed length
before it reads; without the limits of ingest.spark.session.AVRO_LIMIT_OPTIONS that is a
2 GiB array, an OutOfMemoryError no PERMISSIVE from_avro catches, and the executor (under
``local[N]`` the driver itself) exits with status 52. With them each is a SystemLimitException:
the record is a reject (``undecodable``, ``key_undecodable``), the good records around it are
rows, and the session builds on. The same through a Spark Connect server:
tests/acceptance/test_spark_connect.py."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka.schema_registry import Schema

from ingest.spark.session import AVRO_LIMITS, driver_exit_status
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, OffsetRange, TopicPartition
from ingest_dev.registry import client as registry_client
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.integration.test_writer_schema_ids import wire
from tests.kafka_splits import produce, spark_builder, split_over

WRITER = json.dumps(
    {
        "type": "record",
        "name": "Poison",
        "namespace": "acme.poison",
        "fields": [
            {"name": "name", "type": ["null", "string"]},
            {"name": "blob", "type": "bytes"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "id", "type": "long"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
)
KEY = json.dumps(
    {"type": "record", "name": "PoisonKey", "namespace": "acme.poison", "fields": [{"name": "k", "type": "string"}]}
)


def avro_long(n: int) -> bytes:
    """``n`` as Avro writes a long (a length, a block count): zigzag, then a varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    return bytes([*out, z])


#: 2^31 - 9 (the issue's ee ff ff ff 0f): the largest length or count Avro 1.12 allows by default.
CLAIM = avro_long(2**31 - 9)


def good(i: int) -> dict[str, Any]:
    return {"name": f"n{i}", "blob": b"b%d" % i, "tags": ["a", "b"], "id": i, "ts": 1_764_064_800_000 + i}


def header(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big")


@dataclass(frozen=True)
class PoisonSplit:
    """Records produced for the test: what each one is (a good record's id or a poison's
    reject reason), the offsets they got and the source spec's document."""

    kinds: list[int | str]
    offsets: OffsetRange
    spec: dict[str, Any]


def produce_poison(kafka_bootstrap: str, topic: str, registry_url: str, store: Path) -> PoisonSplit:
    client = registry_client(registry_url)
    suffix = uuid.uuid4().hex
    value_id = client.register_schema(f"poison-{suffix}-value", Schema(WRITER, "AVRO"))
    key_id = client.register_schema(f"poison-{suffix}-key", Schema(KEY, "AVRO"))

    def key(i: int) -> bytes:
        return wire(key_id, KEY, {"k": f"k{i}"})

    # The array first: a task's from_avro reuses the array it decoded last (no allocation), so
    # a lying count kills where it is the first array the task decodes (a split's first record).
    records: list[tuple[int | str, bytes, bytes]] = [
        # name null, blob empty; the array's first block count.
        ("undecodable", key(0), header(value_id) + b"\x00\x00" + CLAIM + b"xx"),
        (1, key(1), wire(value_id, WRITER, good(1))),
        # The bytes: union branch 1 (string), then a length of 2^31 - 9 and "xx".
        ("undecodable", key(2), header(value_id) + b"\x02" + CLAIM + b"xx"),
        # name null; the bytes' length (Avro promotes bytes to the string column: readBytes).
        ("undecodable", key(3), header(value_id) + b"\x00" + CLAIM + b"xx"),
        # A key whose string claims the same.
        ("key_undecodable", header(key_id) + CLAIM + b"xx", wire(value_id, WRITER, good(4))),
        (5, key(5), wire(value_id, WRITER, good(5))),
    ]
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), [(k, v) for _, k, v in records])
    spec = {
        "name": "poison",
        "topics": [topic],
        "event_time": "ts",
        "segment_store": str(store),
        "format": "avro",
        "schema": {"name": "string", "blob": "string", "tags": "array<string>", "id": "long", "ts": "timestamp"},
        "key_format": "avro",
        "key_schema": {"k": "string"},
        "registry": {"url": registry_url},
    }
    return PoisonSplit([kind for kind, _, _ in records], offsets, spec)


def assert_rows_and_rejects(segment: object, poison: PoisonSplit) -> None:
    """The good records are rows, each poison a reject with its reason."""
    assert isinstance(segment, BuiltSegment), segment
    assert (segment.row_count, segment.rejects_count) == (2, 4)
    assert dict(segment.parse_errors) == {"undecodable": 3, "key_undecodable": 1}
    data = pa.concat_tables([pq.read_table(f) for f in segment.files]).sort_by("_offset")
    at = poison.offsets.start
    assert data.select(["_offset", "_key_k", "name", "blob", "tags", "id"]).to_pylist() == [
        {"_offset": at + i, "_key_k": f"k{i}", "name": f"n{i}", "blob": f"b{i}", "tags": ["a", "b"], "id": i}
        for i in (1, 5)
    ]
    rejects: dict[int, str] = {}
    for f in segment.rejects_files:
        for row in pq.read_table(f, columns=["_offset", "_error"]).to_pylist():
            rejects[row["_offset"]] = row["_error"]
    assert rejects == {at + n: kind for n, kind in enumerate(poison.kinds) if isinstance(kind, str)}


def test_lying_lengths_are_rejects_and_the_session_lives_on(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    # The driver JVM carries the limits (local[2]: the executors are its threads).
    jvm_system = spark.sparkContext._jvm.java.lang.System
    assert {name: jvm_system.getProperty(name) for name in AVRO_LIMITS} == {k: str(v) for k, v in AVRO_LIMITS.items()}
    poison = produce_poison(
        kafka_bootstrap, make_topic(partitions=1, prefix="poison"), schema_registry_url, tmp_path / "store"
    )
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    # Twice: the second build proves the session survived the first.
    for _ in range(2):
        [segment] = builder.build_batch([split_over(poison.offsets)], spec_from_dict(poison.spec))
        assert driver_exit_status(spark) is None
        assert_rows_and_rejects(segment, poison)
