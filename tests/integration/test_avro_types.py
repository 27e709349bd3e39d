"""Every Avro type into its column, against the real registry, Kafka and Spark, with schemas
nobody here wrote (tests/fixtures/public_schemas: Apache Avro's interop schema, Confluent's
datagen schemas) and one that holds every logical type at every depth.

The column types ``schema_from = "registry"`` gives are the ones Spark's ``from_avro`` gives
(asked of Spark's own SchemaConverters); each record produced is read back from the segment's
Parquet file field by field, as tests/avro_values.py says it must read."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.errors import ConfigError
from ingest.formats.avro import avro_columns
from ingest.formats.types import spark_type
from ingest.segments.store import ensure_parent
from ingest.spec.parse import resolve_registry_schema, spec_from_dict
from ingest.table.catalog import identifier, source_catalog
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_common.model import BuiltSegment, TopicPartition
from metastore.tables import TableKind
from tests.acceptance.test_registry_formats import serializer
from tests.avro_values import Values, public_schema
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.integration.iceberg_harness import DAY0, Source, committer
from tests.kafka_splits import produce, spark_builder, split_over, values

_TS_MICROS = {"type": "long", "logicalType": "timestamp-micros"}
#: Every logical type, nested in records, arrays, maps and unions.
EVERY_TYPE = json.dumps(
    {
        "type": "record",
        "name": "Every",
        "namespace": "test.types",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": _TS_MICROS},
            {"name": "at_millis", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "local_micros", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "local_millis", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
            {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
            {"name": "times", "type": {"type": "array", "items": _TS_MICROS}},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}},
            {
                "name": "fixed_price",
                "type": {
                    "type": "fixed",
                    "name": "Money",
                    "size": 9,
                    "logicalType": "decimal",
                    "precision": 20,
                    "scale": 2,
                },
            },
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "either", "type": ["null", "string", "int"]},
            {"name": "wide", "type": ["int", "long"]},
            {
                "name": "inner",
                "type": {
                    "type": "record",
                    "name": "Inner",
                    "fields": [
                        {"name": "at", "type": _TS_MICROS},
                        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
                        {"name": "same_kind", "type": "Kind"},
                        {"name": "tags", "type": {"type": "map", "values": ["null", _TS_MICROS]}},
                        {"name": "nothing", "type": "null"},
                    ],
                },
            },
            {"name": "inners", "type": {"type": "array", "items": "Inner"}},
        ],
    }
)
#: Datagen's schemas and the interop schema without its recursive field (refused, below).
PUBLIC = [
    "datagen_orders_schema.avsc",
    "datagen_pageviews_schema.avsc",
    "datagen_users_array_map_schema.avsc",
    "datagen_shoe_orders.avsc",
    "datagen_purchase.avsc",
    "datagen_pizza_orders.avsc",
    "datagen_transactions.avsc",
    "avro_interop.avsc",
]


def _schema(name: str) -> str:
    if name == "every":
        return EVERY_TYPE
    text = public_schema(name)
    if name == "avro_interop.avsc":
        doc = json.loads(text)
        doc["fields"] = [f for f in doc["fields"] if f["name"] != "recordField"]
        return json.dumps(doc)
    return text


def test_a_recursive_record_is_refused_with_its_field_named() -> None:
    with pytest.raises(
        ConfigError, match=r"field 'recordField.children\[\]' is the recursive record org.apache.avro.Node"
    ):
        avro_columns(public_schema("avro_interop.avsc"))


@pytest.mark.parametrize("name", [*PUBLIC, "every"])
def test_the_columns_are_the_types_spark_decodes_into(spark: Any, name: str) -> None:
    jvm = spark._jvm
    schema = _schema(name)
    parsed = jvm.org.apache.avro.Schema.Parser().parse(schema)
    spark_struct = jvm.org.apache.spark.sql.avro.SchemaConverters.toSqlType(parsed).dataType()
    expected = {
        spark_struct.fields()[i].name(): spark_struct.fields()[i].dataType().simpleString()
        for i in range(len(spark_struct.fields()))
        if spark_struct.fields()[i].dataType().simpleString() != "void"
    }
    got = {column: spark_type(ctype).simpleString() for column, ctype in avro_columns(schema)}
    # Spark keeps a nested null field as void; it has no column (the reader leaves it out).
    assert got == {c: t.replace(",nothing:void", "") for c, t in expected.items()}


@pytest.mark.parametrize("name", [*PUBLIC, "every"])
def test_each_record_reads_back_field_by_field(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str, name: str
) -> None:
    schema = _schema(name)
    topic = make_topic(partitions=1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    encode = serializer(schema_registry_url, schema)
    gen = Values(schema)
    records = [gen.record(i) for i in range(12)]
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([encode(w, ctx) for w, _ in records]))
    spec = resolve_registry_schema(spec_from_dict(_doc(topic, tmp_path, schema_registry_url)))
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (built.row_count, built.rejects_count) == (12, 0), built.parse_errors
    columns = [c for c, _ in spec.schema]
    rows = pq.read_table([f.removeprefix("file://") for f in built.files]).to_pylist()
    rows.sort(key=lambda r: r["_offset"])
    for row, (_, read) in zip(rows, records, strict=True):
        assert {c: row[c] for c in columns} == read


def test_a_spec_reads_nested_records_enums_and_timestamps_in_the_writers_precision(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """A hand-written [schema] with nested types reads a writer whose records, enums and
    micros timestamps sit at every depth: named as the writer names them, never 1000x off."""
    topic = make_topic(partitions=1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    encode = serializer(schema_registry_url, EVERY_TYPE)
    gen = Values(EVERY_TYPE)
    records = [gen.record(i) for i in range(8)]
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([encode(w, ctx) for w, _ in records]))
    spec = spec_from_dict(
        {
            "name": "every",
            "topics": [topic],
            "event_time": "at",
            "segment_store": str(tmp_path / "store"),
            "format": "avro",
            "registry": {"url": schema_registry_url},
            "schema": {
                "id": "long",
                "at": "timestamp",
                "local_micros": "timestamp_ntz",
                "times": "array<timestamp>",
                "price": "decimal(20,4)",
                "fixed_price": "decimal(20, 2)",
                "inner": "struct<at:timestamp,kind:string,same_kind:string,tags:map<string,timestamp>>",
                "inners": "array<struct<at:timestamp,kind:string>>",
                "absent": "struct<x:int>",
            },
        }
    )
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (built.row_count, built.rejects_count) == (8, 0), built.parse_errors
    rows = pq.read_table([f.removeprefix("file://") for f in built.files]).to_pylist()
    rows.sort(key=lambda r: r["_offset"])
    for row, (_, read) in zip(rows, records, strict=True):
        assert row["absent"] is None
        assert {c: row[c] for c in ("id", "at", "local_micros", "times", "price", "fixed_price")} == {
            c: read[c] for c in ("id", "at", "local_micros", "times", "price", "fixed_price")
        }
        assert row["inner"] == {k: read["inner"][k] for k in ("at", "kind", "same_kind", "tags")}
        assert row["inners"] == [{"at": i["at"], "kind": i["kind"]} for i in read["inners"]]


def test_nested_columns_land_in_the_iceberg_table_as_they_were_written(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str, database_url: str
) -> None:
    """The segment Spark built from the every-type schema, published and committed: the table's
    schema holds the nesting (struct, list, map, decimal, timestamp and timestamptz), and
    pyiceberg reads every field of every row as it was written."""
    topic = make_topic(partitions=1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    encode = serializer(schema_registry_url, EVERY_TYPE)
    gen = Values(EVERY_TYPE)
    records = [gen.record(i) for i in range(6)]
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([encode(w, ctx) for w, _ in records]))
    columns = dict(avro_columns(EVERY_TYPE))
    src = Source(database_url, f"file://{tmp_path}/store", name="every")
    try:
        src.columns, src.event_time = columns, "_timestamp"
        src.apply()
        spec = resolve_registry_schema(
            replace(
                spec_from_dict({**_doc(topic, tmp_path, schema_registry_url), "name": "every"}),
                segment_store=src.root,
            )
        )
        built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
        assert built.row_count == 6
        src.publish_built(built, offsets.end)
        enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
        with committer(database_url, src.name) as c:
            c.commit_all()
        table = source_catalog(database_url, src.name).load_table(identifier(src.name, TableKind.DATA))
        rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["_offset"])
    finally:
        src.store.close()
    assert str(table.schema().find_field("inner").field_type).startswith("struct<")
    for row, (_, read) in zip(rows, records, strict=True):
        assert {c: row[c] for c in columns} == read


def _doc(topic: str, tmp_path: Path, registry_url: str) -> dict[str, Any]:
    return {
        "name": "public",
        "topics": [topic],
        "event_time": "_timestamp",
        "segment_store": str(tmp_path / "store"),
        "format": "avro",
        "schema_from": "registry",
        "registry": {"url": registry_url},
    }


def test_a_field_added_inside_a_nested_record_evolves_the_table(database_url: str, tmp_path: Path) -> None:
    """A spec version whose struct gains a field (a registry version adding a field to a nested
    record): the table's struct gains it at the first commit of such a segment, and the rows
    committed before read it as null."""
    src = Source(database_url, f"file://{tmp_path}/store", name="nested")
    try:
        for version, (ctype, address) in enumerate(
            [
                ("struct<city:string>", pa.struct([("city", pa.string())])),
                ("struct<city:string,zip:long>", pa.struct([("city", pa.string()), ("zip", pa.int64())])),
            ]
        ):
            src.columns, src.event_time = {"address": ctype}, "_timestamp"
            src.apply()
            start = src.next[TopicPartition("events", 0)]
            cities = [{"city": f"c{version}", **({"zip": 1000 + version} if version else {})}]
            table = pa.table(
                {
                    "_topic": ["events"],
                    "_partition": pa.array([0], pa.int32()),
                    "_offset": [start],
                    "_timestamp": pa.array([DAY0], pa.timestamp("us", tz="UTC")),
                    "_key": pa.array([None], pa.binary()),
                    "address": pa.array(cities, address),
                }
            )
            split = uuid.uuid4()
            uri = f"{src.root}/nested/{split}/part-0.parquet"
            ensure_parent(uri)
            pq.write_table(table, uri.removeprefix("file://"))
            built = BuiltSegment(
                split_id=split, location=uri.rpartition("/")[0], files=(uri,), row_count=1, size_bytes=1
            )
            src.publish_built(built, start + 1)
        enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
        with committer(database_url, src.name) as c:
            c.commit_all()
        table = source_catalog(database_url, src.name).load_table(identifier(src.name, TableKind.DATA))
        rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["_offset"])
    finally:
        src.store.close()
    assert [r["address"] for r in rows] == [{"city": "c0", "zip": None}, {"city": "c1", "zip": 1001}]
