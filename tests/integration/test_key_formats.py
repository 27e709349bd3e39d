"""Keys decoded beside ``_key`` (``key_format``), against a real registry, Kafka and Spark: Avro keys
of two writer schema versions in the Confluent wire format, JSON Schema keys, UTF-8 string keys;
a key that does not decode is a reject with its reason, a null key is no error, and a registry
that does not answer for a key's schema id fails the build (RegistryUnavailable, as for values)
rejecting nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.writer_schemas import WriterSchemas
from ingest.errors import BuildError
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_dev.registry import LocalSchemaRegistry
from tests.acceptance.test_registry_formats import NEVER_REGISTERED_ID, V1, order, serializer
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_of, split_over

KEY_V1 = json.dumps(
    {"type": "record", "name": "OrderKey", "namespace": "acme", "fields": [{"name": "id", "type": "long"}]}
)
KEY_V2 = json.dumps(
    {
        "type": "record",
        "name": "OrderKey",
        "namespace": "acme",
        "fields": [{"name": "id", "type": "long"}, {"name": "region", "type": "string", "default": "eu"}],
    }
)
JSON_HEADER = b"\x00" + (7).to_bytes(4, "big")


def make_spec(tmp_path: Path, topic: str, registry_url: str, **over: Any) -> SourceSpec:
    doc: dict[str, Any] = {
        "name": "keys",
        "topics": [topic],
        "event_time": "ts",
        "segment_store": str(tmp_path / "store"),
        "schema": {"id": "long", "ts": "timestamp"},
        "registry": {"url": registry_url},
        **over,
    }
    return spec_from_dict(doc)


def json_value(i: int) -> bytes:
    return json.dumps({"id": i, "ts": f"2026-11-25T10:00:{i % 60:02d}Z"}).encode()


def outputs(segment: BuiltSegment) -> tuple[pa.Table, dict[int, str]]:
    """The segment's rows by offset, and its rejects' reasons by offset."""
    data = pa.concat_tables([pq.read_table(f) for f in segment.files]).sort_by("_offset")
    rejects: dict[int, str] = {}
    for f in segment.rejects_files:
        for row in pq.read_table(f, columns=["_offset", "_error"]).to_pylist():
            rejects[row["_offset"]] = row["_error"]
    return data, rejects


def test_avro_keys_of_two_writer_versions_decode_and_bad_keys_are_rejects(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="keys")
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    k1, k2, v1 = (
        serializer(schema_registry_url, KEY_V1),
        serializer(schema_registry_url, KEY_V2),
        serializer(schema_registry_url, V1),
    )
    pairs = [(k1({"id": i}, kctx), v1(order(i), vctx)) for i in range(10)]
    pairs += [(k2({"id": i, "region": "us"}, kctx), v1(order(i), vctx)) for i in range(10, 20)]
    pairs.append((None, v1(order(20), vctx)))
    good_key = pairs[0][0]
    assert good_key is not None
    bad = [
        ("key_not_confluent_framed", b"plain-key"),
        ("key_not_confluent_framed", b"\x01" + good_key[1:]),
        ("key_unknown_schema_id", b"\x00" + NEVER_REGISTERED_ID.to_bytes(4, "big") + good_key[5:]),
        # A long's varint cut after its first byte.
        ("key_undecodable", good_key[:5] + b"\x80"),
    ]
    pairs += [(key, v1(order(21 + n), vctx)) for n, (_, key) in enumerate(bad)]
    # A record whose value and key are both bad is rejected for its value.
    pairs.append((b"plain-key", b"not framed"))
    spec = make_spec(
        tmp_path,
        topic,
        schema_registry_url,
        format="avro",
        key_format="avro",
        key_schema={"id": "long", "region": "string"},
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), pairs)
    # No wait for the id the registry answers 404 for (tests/integration/test_writer_schema_ids.py waits).
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=WriterSchemas(wait_s=0))
    segment = builder.build(split_over(offsets), spec)

    assert (segment.row_count, segment.rejects_count) == (21, 5)
    assert dict(segment.parse_errors) == {
        "not_confluent_framed": 1,
        "key_not_confluent_framed": 2,
        "key_unknown_schema_id": 1,
        "key_undecodable": 1,
    }
    data, rejects = outputs(segment)
    assert data.column_names == [
        "_topic",
        "_partition",
        "_offset",
        "_timestamp",
        "_key",
        "_key_id",
        "_key_region",
        "id",
        "ts",
    ]
    assert data["_key_id"].to_pylist() == [*range(20), None]
    # Writer v1 has no region: null (every reader field is nullable, null by default).
    assert data["_key_region"].to_pylist() == [None] * 10 + ["us"] * 10 + [None]
    assert data["_key"].to_pylist() == [key for key, _ in pairs[:21]]
    at = offsets.start
    assert rejects == {at + 21 + n: reason for n, (reason, _) in enumerate(bad)} | {at + 25: "not_confluent_framed"}


def test_json_schema_and_string_keys(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="keys")
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    framed = [(JSON_HEADER + json.dumps({"id": i, "tag": f"t{i}"}).encode(), json_value(i)) for i in range(6)]
    framed_bad = [
        ("key_not_confluent_framed", b'{"id": 1}'),
        ("key_undecodable", JSON_HEADER + b'{"id": '),
        ("key_undecodable", JSON_HEADER + b'{"id": "one"}'),
        ("key_undecodable", JSON_HEADER + b"\xff\xfe"),
    ]
    pairs = [*framed, (None, json_value(6)), *((key, json_value(7 + n)) for n, (_, key) in enumerate(framed_bad))]
    spec = make_spec(
        tmp_path, topic, schema_registry_url, key_format="json_schema", key_schema={"id": "long", "tag": "string"}
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), pairs)
    segment = builder.build(split_over(offsets), spec)
    data, rejects = outputs(segment)
    assert (segment.row_count, segment.rejects_count) == (7, 4)
    assert data["_key_id"].to_pylist() == [*range(6), None]
    assert data["_key_tag"].to_pylist() == [f"t{i}" for i in range(6)] + [None]
    assert rejects == {offsets.start + 7 + n: reason for n, (reason, _) in enumerate(framed_bad)}

    pairs = [(f"key-{i}".encode(), json_value(i)) for i in range(5)] + [
        (None, json_value(5)),
        (b"\xff\xfe", json_value(6)),
    ]
    spec = make_spec(tmp_path, topic, schema_registry_url, key_format="string")
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), pairs)
    segment = builder.build(split_over(offsets), spec)
    data, rejects = outputs(segment)
    assert (segment.row_count, segment.rejects_count) == (6, 1)
    assert data["_key_string"].to_pylist() == [f"key-{i}" for i in range(5)] + [None]
    assert rejects == {offsets.start + 6: "key_undecodable"}


def test_a_registry_outage_fails_a_build_of_unfetched_key_schemas_and_rejects_nothing(
    spark: Any,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    private_schema_registry: LocalSchemaRegistry,
) -> None:
    registry = private_schema_registry
    topic = "orders"
    kctx = SerializationContext(topic, MessageField.KEY)
    k1, k2 = serializer(registry.url, KEY_V1), serializer(registry.url, KEY_V2)
    old = [(k1({"id": i}, kctx), json_value(i)) for i in range(10)]
    new = [(k2({"id": i, "region": "us"}, kctx), json_value(i)) for i in range(10, 20)]
    spec = make_spec(tmp_path, topic, registry.url, key_format="avro", key_schema={"id": "long", "region": "string"})
    # The old keys' records, then the new: [0, 10) holds KEY_V1's, [0, 20) both writers'.
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), [*old, *new])
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    first = builder.build(split_of(offsets.tp, 0, 10), spec)
    assert (first.row_count, first.rejects_count) == (10, 0)

    registry.halt()
    # KEY_V1 was fetched by the first build: it decodes through the outage.
    cached = builder.build(split_of(offsets.tp, 0, 10), spec)
    assert (cached.row_count, cached.rejects_count) == (10, 0)
    mixed = split_over(offsets)
    files_before = sorted((tmp_path / "store").rglob("*.parquet"))
    [result] = builder.build_batch([mixed], spec)
    assert isinstance(result, BuildError), result
    assert "did not answer" in str(result)
    assert sorted((tmp_path / "store").rglob("*.parquet")) == files_before

    registry.start()
    [again] = builder.build_batch([mixed], spec)
    assert isinstance(again, BuiltSegment), again
    assert (again.row_count, again.rejects_count, again.skipped_count) == (20, 0, 0)
    data, _ = outputs(again)
    assert data["_key_region"].to_pylist() == [None] * 10 + ["us"] * 10
