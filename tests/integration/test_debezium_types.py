"""Debezium change events as its PostgreSQL and MySQL connectors write them through the JSON
converter with schemas (``{"schema": ..., "payload": ...}``), built by a real Spark from a real
Kafka topic: each temporal and decimal encoding read as the value it stands for, a delete whose
``before`` holds the key only (PostgreSQL's REPLICA IDENTITY DEFAULT), a primary-key change,
and a truncate (a reject of its own: the table is not emptied).

The events follow the shapes of Debezium's connector documentation (the ``schema`` section's
``fields`` per envelope field, semantic types by ``name``, decimals as base64 unscaled bytes
with their ``scale`` parameter)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ingest.spec.parse import spec_from_dict
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.integration.test_upsert_build import check_outcomes, key, outputs
from tests.kafka_splits import produce_blocks, spark_builder, split_over

# 2018-06-20T15:13:16.945104 (PostgreSQL `timestamp`: a local date-time, encoded as if UTC)
CREATED_MICROS = 1_529_507_596_945_104
BIRTH_DAYS = 17_702  # 2018-06-20


def _decimal(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _field(name: str, kind: str, semantic: str | None = None, **parameters: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": kind, "optional": True, "field": name}
    if semantic:
        doc["name"] = semantic
    if parameters:
        doc["parameters"] = parameters
    return doc


POSTGRES_ROW = [
    _field("id", "int32"),
    _field("first_name", "string"),
    _field("birth", "int32", "io.debezium.time.Date"),
    _field("created", "int64", "io.debezium.time.MicroTimestamp"),
    _field("updated", "string", "io.debezium.time.ZonedTimestamp"),
    _field("price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}),
]
MYSQL_ROW = [
    _field("id", "int32"),
    _field("first_name", "string"),
    _field("birth", "int32", "io.debezium.time.Date"),
    # MySQL DATETIME(6) with time.precision.mode=adaptive_time_microseconds is MicroTimestamp;
    # DATETIME(3) (and connect mode) is Timestamp, in milliseconds.
    _field("created", "int64", "io.debezium.time.Timestamp"),
    _field("updated", "string", "io.debezium.time.ZonedTimestamp"),
    _field("price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2"),
]


def event(row_schema: list[dict[str, Any]], op: str, before: Any = None, after: Any = None) -> bytes:
    schema = {
        "type": "struct",
        "fields": [
            {"type": "struct", "fields": row_schema, "optional": True, "field": "before"},
            {"type": "struct", "fields": row_schema, "optional": True, "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
        "optional": False,
        "name": "dbserver1.inventory.customers.Envelope",
    }
    payload = {"before": before, "after": after, "op": op, "source": {"connector": "postgresql"}, "ts_ms": 1}
    return json.dumps({"schema": schema, "payload": payload}).encode()


def pg_row(i: int, price: Decimal) -> dict[str, Any]:
    return {
        "id": i,
        "first_name": f"n{i}",
        "birth": BIRTH_DAYS + i,
        "created": CREATED_MICROS + i,
        "updated": "2018-06-20T13:13:16.945104Z",
        "price": _decimal(price, 2),
    }


def test_debezium_semantic_types_deletes_by_key_and_truncates(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    mysql_row = {**pg_row(9, Decimal("-5.50")), "created": CREATED_MICROS // 1000}
    records: list[tuple[bytes | None, bytes | None, str]] = [
        (key(1), event(POSTGRES_ROW, "c", after=pg_row(1, Decimal("12.34"))), "u"),
        (key(2), event(POSTGRES_ROW, "r", after=pg_row(2, Decimal("-0.07"))), "u"),
        # REPLICA IDENTITY DEFAULT: the delete's before holds the primary key alone.
        (key(1), event(POSTGRES_ROW, "d", before={"id": 1}), "d"),
        (key(1), None, "d"),
        # A primary-key change: a delete of the old key (and its tombstone), a create of the new.
        (key(2), event(POSTGRES_ROW, "d", before={"id": 2}), "d"),
        (key(2), None, "d"),
        (key(3), event(POSTGRES_ROW, "c", after={**pg_row(2, Decimal("-0.07")), "id": 3}), "u"),
        (key(9), event(MYSQL_ROW, "c", after=mysql_row), "u"),
        (None, b'{"schema": null, "payload": {"op": "t", "before": null, "after": null}}', "debezium_truncate"),
        # A value its semantic type cannot read: a type mismatch, not a null column.
        (key(4), event(POSTGRES_ROW, "c", after={**pg_row(4, Decimal(1)), "birth": "not a day"}), "type_mismatch"),
    ]
    topic = make_topic(partitions=1)
    [offsets] = produce_blocks(kafka_bootstrap, topic, [(0, [(k, v) for k, v, _ in records])])
    spec = spec_from_dict(
        {
            "name": "customers",
            "topics": [topic],
            "event_time": "updated",
            "segment_store": str(tmp_path / "store"),
            "schema": {
                "id": "long",
                "first_name": "string",
                "birth": "date",
                "created": "timestamp_ntz",
                "updated": "timestamp",
                "price": "decimal(10,2)",
            },
            "registry": {"url": "http://127.0.0.1:9"},
            "key_format": "json_schema",
            "key_schema": {"id": "long"},
            "table": {"mode": "upsert", "key": ["id"], "envelope": "debezium"},
        }
    )
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    rows = {r["_offset"] - offsets.start: r for r in check_outcomes(built, offsets, records)}
    created = datetime(2018, 6, 20, 15, 13, 16, 945104)
    updated = datetime(2018, 6, 20, 13, 13, 16, 945104, tzinfo=UTC)
    assert {k: rows[0][k] for k in ("id", "birth", "created", "updated", "price")} == {
        "id": 1,
        "birth": date(2018, 6, 21),
        "created": created.replace(microsecond=945105),
        "updated": updated,
        "price": Decimal("12.34"),
    }
    assert rows[1]["price"] == Decimal("-0.07")
    # The key-only delete: its key, the record's Kafka timestamp as its event time.
    assert (rows[2]["_op"], rows[2]["id"], rows[2]["updated"]) == ("d", 1, rows[2]["_timestamp"])
    assert (rows[6]["_op"], rows[6]["id"]) == ("u", 3)
    mysql = rows[7]
    assert (mysql["created"], mysql["price"], mysql["birth"]) == (
        created.replace(microsecond=945000),
        Decimal("-5.50"),
        date(2018, 6, 29),
    )
    _, rejects = outputs(built)
    assert rejects == {offsets.start + 8: "debezium_truncate", offsets.start + 9: "type_mismatch"}
