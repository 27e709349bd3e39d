"""The bench's Avro records: Confluent-framed, and read by the spec's reader schema as the JSON
records are (no registry, no Kafka: the encoding only)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import fastavro
import pytest

from bench import avro_wire as avro
from bench import data
from ingest.formats.avro import avro_columns, avro_reader_schema, decode_schemas
from ingest.formats.wire import schema_id


def test_records_are_framed_and_decode_to_the_json_records_values(monkeypatch: pytest.MonkeyPatch) -> None:
    as_text = data.record_value(7)
    monkeypatch.setattr(avro, "_active", avro.wire("http://127.0.0.1:1/unused", schema_id=42))
    value = data.record_value(7)
    monkeypatch.undo()
    assert data.record_value(7) == as_text, "JSON again once the run is not Avro"
    as_json = json.loads(data.record_value(7))
    assert value[0] == 0 and schema_id(value) == 42
    columns = tuple(data.SCHEMA.items())
    writer, reader = decode_schemas(avro_reader_schema(columns), avro.WRITER_SCHEMA)
    decoded = fastavro.schemaless_reader(
        io.BytesIO(value[5:]),
        fastavro.parse_schema(json.loads(writer)),
        fastavro.parse_schema(json.loads(reader)),
    )
    assert isinstance(decoded, dict)
    ts = decoded.pop("ts")
    assert ts == datetime.fromisoformat(as_json.pop("ts").replace("Z", "+00:00")).astimezone(UTC)
    assert decoded.pop("_ingest_decoded") is True
    assert decoded == as_json


def test_the_writer_schema_has_the_bench_schemas_columns() -> None:
    # The same columns the JSON runs declare: the workers' output is comparable across formats.
    assert dict(avro_columns(avro.WRITER_SCHEMA)) == data.SCHEMA
