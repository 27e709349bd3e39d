"""An upsert source's ``[table] mode / key / envelope``: parsed, checked against the rest of the
spec (the key's columns exist, a tombstone can name its row, Debezium only from JSON), each
refusal one line; the settings round-trip through the stored JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ingest.formats.registry import RegistrySettings
from ingest.spec import parse as spec_parse
from ingest.spec.model import SourceSpec
from ingest.spec.parse import check_upsert, resolve_registry_schema, spec_from_dict
from ingest.spec.table import Envelope, TableMode, TableSettings
from ingest_common.errors import ConfigError

BASE: dict[str, Any] = {
    "name": "users",
    "topics": ["users"],
    "schema": {"id": "long", "name": "string", "ts": "timestamp"},
    "event_time": "ts",
}
STRING_KEY = {"key_format": "string"}
# A key decoded from JSON Schema (the registry's framing): the key's id is ``_key_id``.
JSON_KEY: dict[str, Any] = {
    "registry": {"url": "http://127.0.0.1:8081"},
    "key_format": "json_schema",
    "key_schema": {"id": "long"},
}


def test_upsert_settings_parse_and_round_trip_and_append_is_the_default() -> None:
    spec = spec_from_dict({**BASE, **JSON_KEY, "table": {"mode": "upsert", "key": ["id"]}})
    assert spec.table == TableSettings(mode=TableMode.UPSERT, key=("id",), envelope=Envelope.NONE)
    assert spec.table.upsert
    assert SourceSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    # Keyed on the decoded key's own column, and a Debezium stream keyed on a value column
    # (its tombstones' keys: ingest.builder.plan).
    on_key = spec_from_dict({**BASE, **STRING_KEY, "table": {"mode": "upsert", "key": ["_key_string"]}})
    assert on_key.table.key == ("_key_string",)
    debezium = spec_from_dict({**BASE, "table": {"mode": "upsert", "key": ["id"], "envelope": "debezium"}})
    assert debezium.table.envelope is Envelope.DEBEZIUM
    catalog = {"type": "rest", "uri": "https://cat.example/iceberg"}
    with_catalog = spec_from_dict({**BASE, **STRING_KEY, "table": {"catalog": catalog, "mode": "append"}})
    assert with_catalog.table == TableSettings(catalog=tuple(sorted(catalog.items())))
    assert not spec_from_dict(BASE).table.upsert


@pytest.mark.parametrize(
    ("over", "table", "message"),
    [
        ({}, {"mode": "merge"}, "table.mode: 'merge' is not one of append, upsert"),
        ({}, {"mode": "upsert", "key": ["id"], "envelope": "maxwell"}, "table.envelope: 'maxwell' is not one of"),
        (JSON_KEY, {"mode": "upsert"}, 'table.key: mode = "upsert" needs the columns that name a row'),
        (JSON_KEY, {"mode": "upsert", "key": []}, "got []"),
        (JSON_KEY, {"mode": "upsert", "key": "id"}, "got 'id'"),
        (JSON_KEY, {"mode": "upsert", "key": ["id", "id"]}, "distinct column names"),
        ({}, {"key": ["id"]}, 'table.key: only with mode = "upsert"'),
        ({}, {"mode": "append", "envelope": "debezium"}, 'table.envelope: only with mode = "upsert"'),
        (JSON_KEY, {"mode": "upsert", "key": ["idd"]}, "table.key: 'idd' is not a column of the spec's rows"),
        (JSON_KEY, {"mode": "upsert", "key": ["_key"]}, "table.key: '_key' is not a column"),
        (JSON_KEY, {"mode": "upsert", "key": ["_offset"]}, "table.key: '_offset' is not a column"),
        (
            {**JSON_KEY, "format": "json_schema"},
            {"mode": "upsert", "key": ["id"], "envelope": "debezium"},
            'table.envelope = "debezium": supported for format = "json" only, not "json_schema"',
        ),
        (
            {},
            {"mode": "upsert", "key": ["id"]},
            "table.key: 'id' cannot be read from the Kafka key: a tombstone (null value) carries only the key",
        ),
        (
            STRING_KEY,
            {"mode": "upsert", "key": ["_key_string"], "catalog": {"type": "rest", "uri": "https://cat.example/x"}},
            "supported in the metastore's Iceberg catalog only, not with table.catalog",
        ),
        # The key decodes, but not the key column "name".
        (
            JSON_KEY,
            {"mode": "upsert", "key": ["id", "name"]},
            "table.key: 'name' cannot be read from the Kafka key",
        ),
    ],
)
def test_an_invalid_upsert_table_is_refused_in_one_line(over: dict[str, Any], table: Any, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        spec_from_dict({**BASE, **over, "table": table})
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_change_column_is_no_column_of_an_upsert_spec() -> None:
    """``[schema]`` and the registry's fields cannot name ``_op`` (names start with a letter):
    the check holds the invariant for any spec that reaches the builder."""
    spec = spec_from_dict({**BASE, **JSON_KEY, "table": {"mode": "upsert", "key": ["id"]}})
    with pytest.raises(ConfigError, match="no column may be named _op"):
        check_upsert(replace(spec, schema=(*spec.schema, ("_op", "string"))))
    check_upsert(replace(spec, schema=(*spec.schema, ("_op", "string")), table=TableSettings()))


def test_a_registry_sources_key_is_checked_once_its_columns_are_known(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = [
        {"name": "id", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ]
    record = json.dumps({"type": "record", "name": "User", "fields": fields})

    def latest_schema(settings: RegistrySettings, topic: str, schema_type: str = "AVRO") -> str:
        return record

    monkeypatch.setattr(spec_parse, "latest_schema", latest_schema)
    doc = {
        "name": "users",
        "topics": ["users"],
        "event_time": "ts",
        "format": "avro",
        "schema_from": "registry",
        "registry": {"url": "http://127.0.0.1:8081"},
        "key_format": "avro",
        "key_schema": {"id": "long"},
    }
    spec = resolve_registry_schema(spec_from_dict({**doc, "table": {"mode": "upsert", "key": ["id"]}}))
    assert spec.table.key == ("id",) and ("id", "long") in spec.schema
    unresolved = spec_from_dict({**doc, "table": {"mode": "upsert", "key": ["region"]}})
    with pytest.raises(ConfigError, match=r"table\.key: 'region' is not a column of the spec's rows"):
        resolve_registry_schema(unresolved)
