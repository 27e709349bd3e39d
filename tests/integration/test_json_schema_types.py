"""``format = "json_schema"`` with ``schema_from = "registry"``: the registry's JSON Schema as
the columns, nested objects, arrays, maps and formats, against the real registry, Kafka and
Spark. The schema is json-schema.org's "Getting started" product example (its
``warehouseLocation`` reference made local under ``$defs``), with a map, a date-time, a date and
a nullable property added; Kafka Connect's ``connect.type`` annotations too."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka.schema_registry import Schema

from ingest.errors import ConfigError
from ingest.formats.json_schema import json_schema_columns
from ingest.spec.parse import resolve_registry_schema, spec_from_dict
from ingest_common.model import TopicPartition
from ingest_dev.registry import client as registry_client
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_over, values

PRODUCT = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/product.schema.json",
    "title": "Product",
    "description": "A product from Acme's catalog",
    "type": "object",
    "properties": {
        "productId": {"description": "The unique identifier for a product", "type": "integer"},
        "productName": {"description": "Name of the product", "type": "string"},
        "price": {"description": "The price of the product", "type": "number", "exclusiveMinimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True},
        "dimensions": {
            "type": "object",
            "properties": {"length": {"type": "number"}, "width": {"type": "number"}, "height": {"type": "number"}},
            "required": ["length", "width", "height"],
        },
        "warehouseLocation": {"$ref": "#/$defs/location"},
        "stock": {"type": "object", "additionalProperties": {"type": "integer", "connect.type": "int32"}},
        "updatedAt": {"type": "string", "format": "date-time"},
        "releaseDate": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
        "note": {"type": ["null", "string"]},
    },
    "required": ["productId", "productName", "price"],
    "$defs": {
        "location": {
            "type": "object",
            "properties": {"latitude": {"type": "number"}, "longitude": {"type": "number"}},
        }
    },
}
COLUMNS = (
    ("productId", "long"),
    ("productName", "string"),
    ("price", "double"),
    ("tags", "array<string>"),
    ("dimensions", "struct<length:double,width:double,height:double>"),
    ("warehouseLocation", "struct<latitude:double,longitude:double>"),
    ("stock", "map<string,int>"),
    ("updatedAt", "timestamp"),
    ("releaseDate", "date"),
    ("note", "string"),
)


def test_a_json_schema_becomes_columns_and_refuses_what_has_none() -> None:
    assert json_schema_columns(json.dumps(PRODUCT)) == COLUMNS
    for prop, why in [
        ({"type": ["string", "integer"]}, "has the types"),
        ({"$ref": "other.json#/x"}, "refers to another document"),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "is a anyOf of 2 schemas"),
        ({}, "accepts any value"),
    ]:
        schema = {"type": "object", "properties": {"x": prop}}
        with pytest.raises(ConfigError, match=f"property 'x' {why}"):
            json_schema_columns(json.dumps(schema))
    recursive = {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"$ref": "#/$defs/n"}}}
    with pytest.raises(ConfigError, match="is recursive"):
        json_schema_columns(json.dumps(recursive))


def _product(i: int) -> dict[str, Any]:
    return {
        "productId": i,
        "productName": f"p{i}",
        "price": 1.5 + i,
        "tags": ["a", f"t{i}"],
        "dimensions": {"length": 1.0, "width": 2.0, "height": 3.0 + i},
        "warehouseLocation": {"latitude": -78.75, "longitude": 20.4},
        "stock": {"eu": i, "us": 2**31 - 1},
        "updatedAt": f"2026-12-07T10:00:{i:02d}.5Z",
        "releaseDate": None if i % 2 else "2027-01-31",
        "note": None,
    }


def test_registry_json_schema_records_read_back_field_by_field(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1)
    schema_id = registry_client(schema_registry_url).register_schema(
        f"{topic}-value", Schema(json.dumps(PRODUCT), "JSON")
    )
    header = b"\x00" + schema_id.to_bytes(4, "big")
    records = [_product(i) for i in range(6)]
    offsets = produce(
        kafka_bootstrap, TopicPartition(topic, 0), values([header + json.dumps(r).encode() for r in records])
    )
    spec = resolve_registry_schema(
        spec_from_dict(
            {
                "name": "products",
                "topics": [topic],
                "event_time": "updatedAt",
                "segment_store": str(tmp_path / "store"),
                "format": "json_schema",
                "schema_from": "registry",
                "registry": {"url": schema_registry_url},
            }
        )
    )
    assert spec.schema == COLUMNS
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (built.row_count, built.rejects_count) == (6, 0), built.parse_errors
    rows = sorted(
        (r for f in built.files for r in pq.read_table(f.removeprefix("file://")).to_pylist()),
        key=lambda r: r["_offset"],
    )
    for row, record in zip(rows, records, strict=True):
        i = record["productId"]
        expected = {
            **record,
            "stock": list(record["stock"].items()),
            "updatedAt": datetime(2026, 12, 7, 10, 0, i, 500000, tzinfo=UTC),
            "releaseDate": None if i % 2 else date(2027, 1, 31),
        }
        assert {c: row[c] for c, _ in COLUMNS} == expected
