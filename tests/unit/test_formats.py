"""The Confluent wire format's header, the [registry] section and format checks of a spec, the
Avro reader schemas, and the registry credentials' redaction."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.config import Settings
from ingest.errors import ConfigError
from ingest.formats.avro import DECODED_FIELD, avro_columns, decode_schemas
from ingest.formats.avro_resolution import resolution_problem
from ingest.formats.registry import USER_INFO_ENV
from ingest.formats.wire import schema_id
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common import redact


def spec_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "orders",
        "topics": ["orders"],
        "event_time": "ts",
        "segment_store": "file:///tmp/segments",
        "format": "avro",
        "schema": {"id": "long", "ts": "timestamp", "tags": "array<string>"},
        "registry": {"url": "http://127.0.0.1:8081"},
    }
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00\x00\x00\x00\x07rest", 7),
        (b"\x00\x01\x02\x03\x04", 0x01020304),
        (b"\x00\xff\xff\xff\xff", 2**32 - 1),
        (b"\x00\x00\x00\x01", None),  # too short: 4 bytes
        (b"\x01\x00\x00\x00\x07body", None),  # wrong magic byte
        (b'{"id": 1}', None),
        (b"", None),
        (None, None),
    ],
)
def test_schema_id_reads_the_confluent_header(value: bytes | None, expected: int | None) -> None:
    assert schema_id(value) == expected


def test_an_avro_spec_round_trips_with_its_registry_and_reader_schema() -> None:
    spec = spec_from_dict(spec_doc(registry={"url": "https://reg.example/api/", "subject_strategy": "topic"}))
    assert spec.registry is not None and spec.registry.url == "https://reg.example/api"
    assert spec.registry.subject("orders") == "orders-value"
    reader = json.loads(spec.reader_schema)
    assert [f["name"] for f in reader["fields"]] == ["id", "ts", "tags"]
    assert reader["fields"][1]["type"] == ["null", {"type": "long", "logicalType": "timestamp-millis"}]
    assert SourceSpec.from_json(spec.to_json()) == spec
    record = spec_from_dict(spec_doc(registry={"url": "http://r", "subject_strategy": "record", "record_name": "a.B"}))
    assert record.registry is not None and record.registry.subject("orders") == "a.B"
    framed_json = spec_from_dict(spec_doc(format="json_schema"))
    assert framed_json.reader_schema == "" and framed_json.registry is not None


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"registry": None}, 'format = "avro": needs a [registry] section'),
        ({"format": "json_schema", "registry": None}, 'format = "json_schema": needs a [registry] section'),
        ({"format": "protobuf", "registry": None}, 'format = "protobuf": needs a [registry] section'),
        ({"format": "thrift"}, "format: 'thrift' is not one of json, avro, json_schema, protobuf"),
        ({"schema_from": "registry", "schema": None, "format": "protobuf"}, 'schema_from = "registry": only'),
        ({"registry": "http://r"}, "registry: expected a table"),
        ({"registry": {}}, "registry.url: missing (required"),
        ({"registry": {"url": "ftp://r"}}, "registry.url: expected an http:// or https:// URL"),
        ({"registry": {"url": "http://u:pw@r"}}, f"registry.url: credentials go in {USER_INFO_ENV}"),
        ({"registry": {"url": "http://r", "password": "x"}}, "registry: unknown field(s) password"),
        ({"registry": {"url": "http://r", "subject_strategy": "name"}}, "registry.subject_strategy: 'name'"),
        ({"registry": {"url": "http://r", "subject_strategy": "record"}}, "registry.record_name: required"),
        ({"schema_from": "registry"}, 'schema: not allowed with schema_from = "registry"'),
        ({"schema_from": "topic"}, "schema_from: 'topic' is not one of spec, registry"),
    ],
)
def test_bad_format_or_registry_settings_are_one_clear_line(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec_from_dict(spec_doc(**over))
    text = str(err.value)
    assert "\n" not in text and message in text, text


def test_schema_from_registry_needs_no_schema_until_applied() -> None:
    spec = spec_from_dict(spec_doc(schema=None, schema_from="registry"))
    assert spec.schema == () and spec.reader_schema == ""


def test_registry_schemas_map_to_columns_or_name_the_field() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    assert avro_columns(json.dumps(schema)) == (
        ("id", "long"),
        ("ts", "timestamp"),
        ("day", "date"),
        ("tags", "array<string>"),
    )
    schema["fields"].append({"name": "nested", "type": {"type": "record", "name": "N", "fields": []}})
    # A record without fields (like a field of type null) has no column.
    assert len(avro_columns(json.dumps(schema))) == 4
    schema["fields"].append({"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 39}})
    with pytest.raises(ConfigError, match=r"field 'price' is decimal\(39,0\), which has no column type"):
        avro_columns(json.dumps(schema))


def reader_for_writer(reader: str, writer: str) -> str:
    """The reader half of decode_schemas."""
    return decode_schemas(reader, writer)[1]


def test_the_reader_follows_each_writer_name_and_timestamp_precision() -> None:
    spec = spec_from_dict(spec_doc())
    writer = {
        "type": "record",
        "name": "Order",
        "namespace": "acme",
        "fields": [{"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}],
    }
    reader = json.loads(reader_for_writer(spec.reader_schema, json.dumps(writer)))
    assert reader["name"] == "ingest.w.v"
    assert reader["fields"][1]["type"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    assert reader["fields"][-1] == {"name": DECODED_FIELD, "type": "boolean", "default": True}
    # A registry's reader (not nullable here) in micros follows a millis writer, and the
    # reverse: Avro would hand the long over unscaled, 1000 times off.
    registry_reader = {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}],
    }
    millis_writer = {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}],
    }
    followed = json.loads(reader_for_writer(json.dumps(registry_reader), json.dumps(millis_writer)))
    assert followed["fields"][0]["type"] == {"type": "long", "logicalType": "timestamp-millis"}
    back = json.loads(reader_for_writer(json.dumps(millis_writer), json.dumps(registry_reader)))
    assert back["fields"][0]["type"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]


def test_registry_credentials_from_the_environment_are_redacted() -> None:
    env = {"INGEST_DATABASE_URL": "postgresql://ingest@db.example/ingest", USER_INFO_ENV: "reg-user:reg-s3cret"}
    settings = Settings.from_env(env, require_kafka=False)
    try:
        redact.register_secrets(settings.secret_values())
        # The client's error may show the pair or the password alone.
        text = redact.redact("401 for reg-user:reg-s3cret; basic auth password reg-s3cret")
    finally:
        redact.forget_secrets()
    assert "reg-s3cret" not in text, text


def test_nested_writers_are_read_at_every_depth_in_their_precision_and_names() -> None:
    """A spec's nested columns against a writer whose records, enums and micros timestamps sit
    inside records, arrays and maps, one record type used twice: each use its own reader."""
    micros = {"type": "long", "logicalType": "timestamp-micros"}
    inner = {
        "type": "record",
        "name": "Inner",
        "fields": [
            {"name": "at", "type": micros},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        ],
    }
    writer = {
        "type": "record",
        "name": "Outer",
        "namespace": "acme",
        "fields": [
            {"name": "times", "type": {"type": "array", "items": micros}},
            {"name": "inner", "type": inner},
            {"name": "inners", "type": {"type": "map", "values": "Inner"}},
        ],
    }
    spec = spec_from_dict(
        spec_doc(
            schema={
                "ts": "timestamp",
                "times": "array<timestamp>",
                "inner": "struct<at:timestamp,kind:string>",
                "inners": "map<string,struct<kind:string>>",
            }
        )
    )
    inlined, adapted = decode_schemas(spec.reader_schema, json.dumps(writer))
    assert resolution_problem(inlined, adapted) is None
    reader = json.loads(adapted)
    fields = {f["name"]: f["type"] for f in reader["fields"]}
    assert fields["times"][1]["items"] == ["null", micros]
    at, kind = fields["inner"][1]["fields"]
    assert at["type"] == ["null", micros]
    assert kind["type"][1]["type"] == "enum"
    # The second use of Inner reads only its kind: a reader of its own, under another name.
    values_reader = fields["inners"][1]["values"][1]
    assert [f["name"] for f in values_reader["fields"]] == ["kind"]
    assert values_reader["name"] != fields["inner"][1]["name"]
