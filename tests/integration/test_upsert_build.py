"""An upsert source's segments, built by a real (local) Spark from a real Kafka topic: each row
carries its change in ``_op``; a tombstone is a delete keyed from the Kafka key, its event time
the record's Kafka timestamp; a record without its key is a reject; a Debezium JSON stream
(bare and wrapped in ``payload``) gives ``after`` for c/u/r and ``before`` for d. An append
source's segment of the same records is what it always was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, OffsetRange
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import Record, produce_blocks, spark_builder, split_over

JSON_HEADER = b"\x00" + (7).to_bytes(4, "big")
TS = "2026-11-22T10:00:00Z"
META = ["_topic", "_partition", "_offset", "_timestamp", "_key"]


def key(i: int) -> bytes:
    """A JSON Schema key (the registry's framing; its id is never looked up)."""
    return JSON_HEADER + json.dumps({"id": i}).encode()


def row(i: int, name: str, ts: str | None = TS) -> dict[str, Any]:
    return {"id": i, "name": name, "ts": ts}


def change(op: str, before: Any = None, after: Any = None, *, wrapped: bool = False) -> bytes:
    event = {"before": before, "after": after, "op": op, "source": {"db": "shop"}, "ts_ms": 1}
    if wrapped:
        return json.dumps({"schema": {"type": "struct", "optional": False}, "payload": event}).encode()
    return json.dumps(event).encode()


# (key, value, what the build makes of it: an _op or a reject's reason)
KEYED: list[tuple[bytes | None, bytes | None, str]] = [
    (key(1), json.dumps(row(1, "ann")).encode(), "u"),
    (key(2), json.dumps(row(2, "bob")).encode(), "u"),
    (key(1), None, "d"),
    (None, None, "tombstone_without_key"),
    # A tombstone whose key does not decode: the key's own reason.
    (JSON_HEADER + b'{"id": "one"}', None, "key_undecodable"),
    (key(3), json.dumps({"name": "cy", "ts": TS}).encode(), "null_key"),
    (key(4), b"{broken", "invalid_json"),
    (key(5), json.dumps({"id": 5, "name": "di"}).encode(), "missing_event_time"),
]
DEBEZIUM: list[tuple[bytes | None, bytes | None, str]] = [
    (key(1), change("c", after=row(1, "ann")), "u"),
    (key(1), change("u", before=row(1, "ann"), after=row(1, "anne"), wrapped=True), "u"),
    (key(2), change("r", after=row(2, "bob"), wrapped=True), "u"),
    (key(1), change("d", before=row(1, "anne")), "d"),
    (key(2), change("d", before=row(2, "bob"), wrapped=True), "d"),
    # Debezium's tombstone after a delete; one whose key does not decode is a row all the same
    # (its key null: the table's merge skips it), never a reject per delete.
    (key(2), None, "d"),
    (None, None, "d"),
    (key(3), change("t", after=row(3, "cy")), "debezium_truncate"),
    (key(3), change("c", before=row(3, "cy")), "invalid_envelope"),
    (key(3), change("d", after=row(3, "cy"), wrapped=True), "invalid_envelope"),
    (key(3), change("c", after=row(3, "cy", ts=None)), "missing_event_time"),
    (key(3), change("u", after={"name": "cy", "ts": TS}), "null_key"),
    (key(3), b'{"op": "c", "after": {"id": "three"}}', "type_mismatch"),
]


def make_spec(tmp_path: Path, topic: str, **over: Any) -> SourceSpec:
    return spec_from_dict(
        {
            "name": "users",
            "topics": [topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "schema": {"id": "long", "name": "string", "ts": "timestamp"},
            # json_schema keys never ask the registry for their id: no registry runs here.
            "registry": {"url": "http://127.0.0.1:9"},
            "key_format": "json_schema",
            "key_schema": {"id": "long"},
            "file_partition": "day",
            **over,
        }
    )


def outputs(segment: BuiltSegment) -> tuple[pa.Table, dict[int, str]]:
    """The segment's rows by offset, and its rejects' reasons by offset."""
    data = pa.concat_tables([pq.read_table(f.removeprefix("file://")) for f in segment.files]).sort_by("_offset")
    rejects = {
        r["_offset"]: r["_error"]
        for f in segment.rejects_files
        for r in pq.read_table(f.removeprefix("file://"), columns=["_offset", "_error"]).to_pylist()
    }
    return data, rejects


def check_outcomes(
    segment: BuiltSegment, offsets: OffsetRange, records: list[tuple[bytes | None, bytes | None, str]]
) -> list[dict[str, Any]]:
    """Each record is a row with its expected ``_op``, or a reject with its expected reason; the
    split's records all accounted for. Returns the rows."""
    data, rejects = outputs(segment)
    rows = data.to_pylist()
    expected_rows = {offsets.start + i: want for i, (_, _, want) in enumerate(records) if want in ("u", "d")}
    expected_rejects = {offsets.start + i: want for i, (_, _, want) in enumerate(records) if want not in ("u", "d")}
    assert {r["_offset"]: r["_op"] for r in rows} == expected_rows
    assert rejects == expected_rejects
    assert segment.row_count + segment.rejects_count + segment.skipped_count == offsets.end - offsets.start
    return rows


def test_upsert_segments_hold_changes_with_tombstones_keyed_from_the_kafka_key(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(partitions=2, prefix="upsert")
    blocks: list[tuple[int, list[Record]]] = [(0, [(k, v) for k, v, _ in KEYED]), (1, [(k, v) for k, v, _ in DEBEZIUM])]
    keyed_offsets, debezium_offsets = produce_blocks(kafka_bootstrap, topic, blocks)
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())

    upsert = make_spec(tmp_path, topic, table={"mode": "upsert", "key": ["id"]})
    keyed = builder.build(split_over(keyed_offsets), upsert)
    rows = check_outcomes(keyed, keyed_offsets, KEYED)
    assert list(pq.read_schema(keyed.files[0].removeprefix("file://")).names) == [
        *META,
        "_key_id",
        "id",
        "name",
        "ts",
        "_op",
    ]
    assert [(r["id"], r["name"]) for r in rows] == [(1, "ann"), (2, "bob"), (1, None)]
    deleted = rows[2]
    # The tombstone's key from the Kafka key, its event time (and its file's day) from its timestamp.
    assert deleted["_key_id"] == 1 and deleted["ts"] == deleted["_timestamp"] is not None
    [tombstone_file] = [f for f in keyed.files if pq.read_table(f.removeprefix("file://"))["_op"][0].as_py() == "d"]
    assert f"/ingest-part={deleted['_timestamp']:%Y-%m-%d}/" in tombstone_file
    assert keyed.max_event_time == max(r["ts"] for r in rows)
    assert dict(keyed.parse_errors) == {
        "tombstone_without_key": 1,
        "key_undecodable": 1,
        "null_key": 1,
        "invalid_json": 1,
        "missing_event_time": 1,
    }

    debezium = make_spec(tmp_path, topic, table={"mode": "upsert", "key": ["id"], "envelope": "debezium"})
    changes = builder.build(split_over(debezium_offsets), debezium)
    rows = check_outcomes(changes, debezium_offsets, DEBEZIUM)
    # c/u/r: the row after; d: the row before, whole; the tombstone: its key and timestamp.
    assert [(r["id"], r["name"], r["_op"]) for r in rows] == [
        (1, "ann", "u"),
        (1, "anne", "u"),
        (2, "bob", "u"),
        (1, "anne", "d"),
        (2, "bob", "d"),
        (2, None, "d"),
        (None, None, "d"),
    ]
    assert rows[5]["ts"] == rows[5]["_timestamp"] and all(
        r["ts"].isoformat() == "2026-11-22T10:00:00+00:00" for r in rows[:5]
    )

    # The same records from an append source: its columns and rejects as ever, no _op.
    append = builder.build(split_over(keyed_offsets), make_spec(tmp_path, topic))
    data, rejects = outputs(append)
    assert data.column_names == [*META, "_key_id", "id", "name", "ts"]
    assert (append.row_count, rejects[keyed_offsets.start + 2], rejects[keyed_offsets.start + 3]) == (
        3,
        "null_value",
        "null_value",
    )
