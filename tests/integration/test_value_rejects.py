"""Values no segment may carry are rejects of their own records, against real Kafka, Spark and
(for Avro) the schema registry: an Avro string (at the top, in an array, in the key) whose bytes
are not UTF-8, and a timestamp or date outside years 1-9999 (Avro's timestamp-millis and date,
JSON's number of seconds and ``+10000`` text, in a map of arrays). Spark holds such values; a
segment holding one could never be appended to the Iceberg table (pyiceberg reads its column
statistics as Python strings and datetimes). The good records around them are rows."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka.schema_registry import Schema

from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_dev.registry import client as registry_client
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.integration.test_writer_schema_ids import wire
from tests.kafka_splits import produce, spark_builder, split_over, values

WRITER = json.dumps(
    {
        "type": "record",
        "name": "Visit",
        "namespace": "acme.values",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "user", "type": "string"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
)
KEY = json.dumps(
    {"type": "record", "name": "VisitKey", "namespace": "acme.values", "fields": [{"name": "k", "type": "string"}]}
)
TS = 1_764_064_800_000  # 2025-11-25T10:00:00Z
YEAR_10000_MS = 253_402_300_800_000
YEAR_10000_DAYS = 2_932_897
# Written in place of a placeholder of the same length (Avro's length prefix stays right): the
# bytes no Python string holds, which a producer in another language can send.
PLACEHOLDER, NOT_UTF8 = b"@@@@", b"a\xff\xfeb"


def visit(i: int, **fields: Any) -> dict[str, Any]:
    return {"id": i, "user": f"u{i}", "tags": ["a", "b"], "seen": TS, "day": 20_000, "ts": TS + i, **fields}


def not_utf8(encoded: bytes) -> bytes:
    assert encoded.count(PLACEHOLDER) == 1
    return encoded.replace(PLACEHOLDER, NOT_UTF8)


def reasons(segment: BuiltSegment) -> dict[int, str]:
    out: dict[int, str] = {}
    for f in segment.rejects_files:
        for row in pq.read_table(f, columns=["_offset", "_error"]).to_pylist():
            out[row["_offset"]] = row["_error"]
    return out


def rows(segment: BuiltSegment, columns: list[str]) -> list[dict[str, Any]]:
    table = pa.concat_tables([pq.read_table(f, columns=columns) for f in segment.files]).sort_by("_offset")
    return list(table.to_pylist())


def test_avro_strings_not_utf8_and_times_out_of_range_are_rejects(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    client = registry_client(schema_registry_url)
    suffix = uuid.uuid4().hex
    value_id = client.register_schema(f"values-{suffix}-value", Schema(WRITER, "AVRO"))
    key_id = client.register_schema(f"values-{suffix}-key", Schema(KEY, "AVRO"))

    def key(i: int) -> bytes:
        return wire(key_id, KEY, {"k": f"k{i}"})

    def value(i: int, **fields: Any) -> bytes:
        return wire(value_id, WRITER, visit(i, **fields))

    records: list[tuple[int | str, bytes, bytes]] = [
        (0, key(0), value(0)),
        ("invalid_utf8", key(1), not_utf8(value(1, user="@@@@"))),
        ("invalid_utf8", key(2), not_utf8(value(2, tags=["ok", "@@@@"]))),
        ("timestamp_out_of_range", key(3), value(3, seen=YEAR_10000_MS)),
        ("timestamp_out_of_range", key(4), value(4, seen=-62_135_596_800_001)),
        ("timestamp_out_of_range", key(5), value(5, day=YEAR_10000_DAYS)),
        ("event_time_out_of_range", key(6), value(6, ts=YEAR_10000_MS)),
        ("key_undecodable", not_utf8(wire(key_id, KEY, {"k": "@@@@"})), value(7)),
        # The last good values: 9999-12-31T23:59:59.999Z and 9999-12-31.
        (8, key(8), value(8, seen=YEAR_10000_MS - 1, day=YEAR_10000_DAYS - 1)),
    ]
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), [(k, v) for _, k, v in records])
    spec = spec_from_dict(
        {
            "name": "visits",
            "topics": [offsets.tp.topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "avro",
            "schema": {
                "id": "long",
                "user": "string",
                "tags": "array<string>",
                "seen": "timestamp",
                "day": "date",
                "ts": "timestamp",
            },
            "key_format": "avro",
            "key_schema": {"k": "string"},
            "registry": {"url": schema_registry_url},
        }
    )
    segment = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert isinstance(segment, BuiltSegment), segment
    at = offsets.start
    assert reasons(segment) == {at + n: kind for n, (kind, _, _) in enumerate(records) if isinstance(kind, str)}
    assert dict(segment.parse_errors) == {
        "invalid_utf8": 2,
        "timestamp_out_of_range": 3,
        "event_time_out_of_range": 1,
        "key_undecodable": 1,
    }
    assert (segment.row_count, segment.rejects_count) == (2, 7)
    # The good rows, their values whole; read back as Python values (what failed on the others).
    assert [
        (r["_offset"], r["_key_k"], r["user"], r["seen"].year, r["day"].year)
        for r in rows(segment, ["_offset", "_key_k", "user", "seen", "day"])
    ] == [(at, "k0", "u0", 2025, 2024), (at + 8, "k8", "u8", 9999, 9999)]


def test_json_times_out_of_range_at_any_depth_are_rejects(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    ts = '"ts": "2026-11-24T10:00:00Z"'
    records: list[tuple[int | str, bytes]] = [
        (0, f'{{"id": 0, "seen": 1700000000, {ts}}}'.encode()),
        # A number of seconds past 9999, and before year 1.
        ("timestamp_out_of_range", f'{{"id": 1, "seen": 253402300800, {ts}}}'.encode()),
        ("timestamp_out_of_range", f'{{"id": 2, "seen": -62135596801, {ts}}}'.encode()),
        ("timestamp_out_of_range", f'{{"id": 3, "day": "+10000-01-01", {ts}}}'.encode()),
        # Deep: a timestamp in an array in a map.
        (
            "timestamp_out_of_range",
            f'{{"id": 4, "visits": {{"a": ["2026-01-01T00:00:00Z", 253402300800]}}, {ts}}}'.encode(),
        ),
        (5, f'{{"id": 5, "visits": {{"a": ["2026-01-01T00:00:00Z", null]}}, "user": "\\ud800", {ts}}}'.encode()),
    ]
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values([v for _, v in records]))
    spec = spec_from_dict(
        {
            "name": "visits",
            "topics": [offsets.tp.topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "schema": {
                "id": "long",
                "user": "string",
                "seen": "timestamp",
                "day": "date",
                "visits": "map<string,array<timestamp>>",
                "ts": "timestamp",
            },
        }
    )
    segment = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert isinstance(segment, BuiltSegment), segment
    at = offsets.start
    assert reasons(segment) == {at + n: kind for n, (kind, _) in enumerate(records) if isinstance(kind, str)}
    assert dict(segment.parse_errors) == {"timestamp_out_of_range": 4}
    # An escaped lone surrogate reads as "?" (valid UTF-8): JSON strings need no check of their own.
    assert [(r["_offset"], r["user"]) for r in rows(segment, ["_offset", "user"])] == [(at, None), (at + 5, "?")]
