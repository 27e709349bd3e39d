"""A Protobuf build against a real registry, Kafka and Spark: two writer versions of one file (the
message second in it, an import registered as a reference, the well-known Timestamp), nested
messages, a repeated field and an enum decoded in the Spark job into the spec's columns, and
bad records, each a reject with its reason, rows + rejects == records; values no column may hold
(an integer past a floating-point column's exact range, a proto2 string that is not UTF-8),
each a reject of its own record, not a failed job."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.writer_schemas import WriterSchemas
from ingest.spec.parse import spec_from_dict
from ingest_common.model import TopicPartition
from tests.acceptance.test_registry_formats import NEVER_REGISTERED_ID
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_over, values
from tests.protobuf_orders import (
    ORDER_COLUMNS,
    READING_COLUMNS,
    OrderVersion,
    framed,
    order,
    reading,
    reading_class,
    string_field,
    when,
)


def test_two_writer_versions_and_bad_records_in_one_job(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="pb")
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = OrderVersion.make(1), OrderVersion.make(2)
    encode1, encode2 = framed(schema_registry_url, v1.Order, ctx), framed(schema_registry_url, v2.Order, ctx)
    old = [encode1(order(v1, i)) for i in range(30)]
    new_orders = [order(v2, i, quantity=i % 4) for i in range(30, 60)]
    for msg in new_orders:
        msg.seen.add().FromDatetime(when(1))
    new = [encode2(msg) for msg in new_orders]
    header = old[0][:6]  # magic, v1's id, the index list [1] (count 1, index 1: two bytes)
    assert header[5:6] == b"\x02"
    body = old[0][7:]
    bad = {
        "not_confluent_framed": [b"\x01" + old[0][1:], b'{"id": 1}'],
        "unknown_schema_id": [b"\x00" + NEVER_REGISTERED_ID.to_bytes(4, "big") + old[0][5:]],
        # The file has two top-level messages and Order one nested type.
        "unknown_message_index": [header + b"\x04" + body, header[:5] + b"\x04\x02\x02" + body],
        # A varint field with no value; a string whose length runs past the end.
        "undecodable": [header + b"\x02\x08", header + b"\x02\x22\x40ab"],
        "null_value": [None],
    }
    bad_values = [value for values in bad.values() for value in values]
    spec = spec_from_dict(
        {
            "name": "orders",
            "topics": [topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "protobuf",
            "schema": ORDER_COLUMNS,
            "registry": {"url": schema_registry_url},
        }
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([*old, *bad_values, *new]))
    # No wait for the id the registry answers 404 for (tests/integration/test_writer_schema_ids.py waits).
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=WriterSchemas(wait_s=0))
    segment = builder.build(split_over(offsets), spec)

    assert (segment.row_count, segment.rejects_count) == (60, len(bad_values))
    assert dict(segment.parse_errors) == {reason: len(vs) for reason, vs in bad.items()}
    rows = sorted((r for f in segment.files for r in pq.read_table(f).to_pylist()), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(60))
    at, skip = offsets.start, len(bad_values)
    assert [r["_offset"] for r in rows] == [*range(at, at + 30), *range(at + 30 + skip, at + 60 + skip)]
    first, last = rows[0], rows[-1]
    assert (first["ts"], first["status"], first["tags"], first["customer__address__city"]) == (
        when(0),
        "NEW",
        ["x", "0"],
        "city-0",
    )
    # v1 has neither quantity nor seen; v2 has both.
    assert (first["quantity"], first["seen"]) == (None, None)
    assert (last["quantity"], last["seen"], last["status"]) == (59 % 4, [when(1)], "SHIPPED")
    assert Counter(r["customer__name"] for r in rows)["user-0"] == len([i for i in range(60) if i % 7 == 0])
    rejects = [r for f in segment.rejects_files for r in pq.read_table(f).to_pylist()]
    assert Counter(r["_error"] for r in rejects) == Counter({reason: len(vs) for reason, vs in bad.items()})
    assert sorted(r["_value"] or b"" for r in rejects) == sorted(v or b"" for v in bad_values)


def test_values_no_column_holds_are_rejects_of_their_own_records(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="pb")
    cls = reading_class()
    encode = framed(schema_registry_url, cls, SerializationContext(topic, MessageField.VALUE))
    good = [encode(reading(cls, i, big=2**53 - i, small=-(2**24) + i)) for i in range(20)]
    bad = {
        "unresolvable": [
            encode(reading(cls, 20, big=2**53 + 1)),
            encode(reading(cls, 21, huge=2**64 - 1)),
            encode(reading(cls, 22, small=2**24 + 1)),
            encode(reading(cls, 23, bigs=[0, -(2**60)])),
        ],
        "invalid_utf8": [
            encode(reading(cls, 24)) + string_field(3, b"\xff"),
            encode(reading(cls, 25)) + string_field(5, string_field(1, b"\xc0\x80")),
        ],
    }
    bad_values = [value for values in bad.values() for value in values]
    spec = spec_from_dict(
        {
            "name": "readings",
            "topics": [topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "protobuf",
            "schema": READING_COLUMNS,
            "registry": {"url": schema_registry_url},
        }
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([*good[:10], *bad_values, *good[10:]]))
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    segment = builder.build(split_over(offsets), spec)

    assert (segment.row_count, segment.rejects_count) == (len(good), len(bad_values))
    assert dict(segment.parse_errors) == {reason: len(vs) for reason, vs in bad.items()}
    rows = sorted((r for f in segment.files for r in pq.read_table(f).to_pylist()), key=lambda r: r["id"])
    assert [(r["id"], r["big"], r["small"]) for r in rows] == [(i, 2.0**53 - i, -(2.0**24) + i) for i in range(20)]
    rejects = [r for f in segment.rejects_files for r in pq.read_table(f).to_pylist()]
    assert Counter(r["_error"] for r in rejects) == Counter({reason: len(vs) for reason, vs in bad.items()})
    assert sorted(r["_value"] for r in rejects) == sorted(bad_values)


def test_protobufs_own_example_nested_into_structs_arrays_and_maps(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """addressbook.proto (repeated messages holding repeated messages, an enum, a Timestamp)
    and a message of maps and bytes, through the registry and Spark's mapInArrow into nested
    columns, read back from the segment's Parquet file."""
    from tests.unit.test_protobuf_nested import PERSON, addressbook_classes, person_message, person_read

    person, _, extras = addressbook_classes()
    topic = make_topic(partitions=1, prefix="pb")
    ctx = SerializationContext(topic, MessageField.VALUE)
    encode = framed(schema_registry_url, extras, ctx)
    records = []
    for i in range(5):
        msg = extras(counts={"n": i}, blob=bytes([i, 255]), owner=person_message(person, i))
        msg.by_name[f"k{i}"].CopyFrom(person_message(person, i + 10))
        records.append(encode(msg))
    spec = spec_from_dict(
        {
            "name": "extras",
            "topics": [topic],
            "event_time": "_timestamp",
            "segment_store": str(tmp_path / "store"),
            "format": "protobuf",
            "schema": {
                "counts": "map<string,long>",
                "blob": "binary",
                "by_name": f"map<string,{PERSON}>",
                "owner": PERSON,
            },
            "registry": {"url": schema_registry_url},
        }
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values(records))
    segment = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (segment.row_count, segment.rejects_count) == (5, 0), segment.parse_errors
    rows = sorted(
        (r for f in segment.files for r in pq.read_table(f.removeprefix("file://")).to_pylist()),
        key=lambda r: r["_offset"],
    )
    assert [(r["counts"], r["blob"], r["by_name"], r["owner"]) for r in rows] == [
        ([("n", i)], bytes([i, 255]), [(f"k{i}", person_read(i + 10))], person_read(i)) for i in range(5)
    ]
