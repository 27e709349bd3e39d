"""What ``source apply`` refuses when an Avro source's reader schema changes (ingest.spec.evolution),
and the reader schema of ``schema_from = "registry"`` over several topics (one for all)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ingest.errors import ConfigError
from ingest.formats.registry import RegistrySettings
from ingest.spec import parse as spec_parse
from ingest.spec.evolution import evolution_problem
from ingest.spec.model import SourceSpec
from ingest.spec.parse import resolve_registry_schema, spec_from_dict


def avro_spec(schema: dict[str, str], **over: Any) -> SourceSpec:
    doc: dict[str, Any] = {
        "name": "orders",
        "topics": ["orders"],
        "event_time": "ts",
        "segment_store": "file:///tmp/segments",
        "format": "avro",
        "schema": {"ts": "timestamp", **schema},
        "registry": {"url": "http://127.0.0.1:8081"},
        **over,
    }
    return spec_from_dict(doc)


def registry_record(*fields: dict[str, Any]) -> str:
    ts = {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}
    return json.dumps({"type": "record", "name": "Order", "namespace": "acme", "fields": [ts, *fields]})


def from_registry(schema: str, columns: tuple[tuple[str, str], ...]) -> SourceSpec:
    base = avro_spec({})
    return replace(base, schema_from="registry", schema=(("ts", "timestamp"), *columns), reader_schema=schema)


def test_a_spec_reader_may_add_drop_and_widen_columns() -> None:
    before = avro_spec({"id": "int", "amount": "float", "user": "string"})
    assert evolution_problem(before, avro_spec({"id": "long", "amount": "double", "region": "string"})) is None
    assert evolution_problem(before, before) is None


@pytest.mark.parametrize(("old", "new"), [("long", "string"), ("long", "int"), ("double", "float"), ("int", "double")])
def test_a_column_type_change_other_than_widening_is_refused_in_one_line(old: str, new: str) -> None:
    problem = evolution_problem(avro_spec({"id": old}), avro_spec({"id": new}))
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"column 'id' changes type from {old} to {new}")


def test_a_registry_version_adding_a_field_with_a_default_is_allowed_without_one_refused() -> None:
    v1 = from_registry(registry_record({"name": "id", "type": "long"}), (("id", "long"),))
    v2 = from_registry(
        registry_record({"name": "id", "type": "long"}, {"name": "region", "type": "string", "default": "eu"}),
        (("id", "long"), ("region", "string")),
    )
    assert evolution_problem(v1, v2) is None
    no_default = from_registry(
        registry_record({"name": "id", "type": "long"}, {"name": "region", "type": "string"}),
        (("id", "long"), ("region", "string")),
    )
    assert evolution_problem(v1, no_default) == (
        "the new reader schema cannot read records written with the previous one: "
        "field 'region': the reader's field has no default and the writer lacks it"
    )
    # From a spec's reader (no writer's schema) to the registry's and back: only the column rule.
    spec_reader = avro_spec({"id": "long"})
    assert evolution_problem(spec_reader, v2) is None
    assert evolution_problem(v2, spec_reader) is None
    assert evolution_problem(spec_reader, replace(no_default, schema=(("ts", "timestamp"), ("id", "string")))) == (
        evolution_problem(spec_reader, avro_spec({"id": "string"}))
    )


def test_other_formats_and_first_versions_are_not_checked() -> None:
    json_spec = replace(avro_spec({"id": "long"}), format="json", reader_schema="")
    assert evolution_problem(json_spec, avro_spec({"id": "string"})) is None
    assert evolution_problem(avro_spec({"id": "long"}), replace(json_spec, schema=(("id", "string"),))) is None


def test_registry_reader_schema_over_several_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    latest = {
        "a-value": registry_record({"name": "id", "type": "long"}),
        "b-value": registry_record({"name": "id", "type": "long"}),
        "c-value": registry_record({"name": "id", "type": "string"}),
    }
    asked: list[str] = []

    def latest_schema(settings: RegistrySettings, topic: str, schema_type: str = "AVRO") -> str:
        assert schema_type == "AVRO"
        asked.append(settings.subject(topic))
        return latest[settings.subject(topic)]

    monkeypatch.setattr(spec_parse, "latest_schema", latest_schema)
    registry = {"url": "http://127.0.0.1:8081"}
    doc: dict[str, Any] = {
        "name": "orders",
        "event_time": "ts",
        "format": "avro",
        "schema_from": "registry",
        "registry": registry,
    }
    spec = resolve_registry_schema(spec_from_dict({**doc, "topics": ["a", "b"]}))
    assert spec.schema == (("ts", "timestamp"), ("id", "long"))
    assert asked == ["a-value", "b-value"]
    with pytest.raises(ConfigError) as refused:
        resolve_registry_schema(spec_from_dict({**doc, "topics": ["a", "b", "c"]}))
    assert "subjects 'a-value' and 'c-value' have different fields" in str(refused.value)
    # One subject for every topic (record name strategy): asked once.
    asked.clear()
    latest["acme.Order"] = latest["c-value"]
    record = {**registry, "subject_strategy": "record", "record_name": "acme.Order"}
    spec = resolve_registry_schema(spec_from_dict({**doc, "topics": ["a", "b", "c"], "registry": record}))
    assert spec.schema == (("ts", "timestamp"), ("id", "string")) and asked == ["acme.Order"]


def test_the_table_mode_key_and_envelope_never_change() -> None:
    from ingest.spec.table import Envelope, TableMode, TableSettings

    log = avro_spec({"id": "long"})
    upsert = replace(log, table=TableSettings(mode=TableMode.UPSERT, key=("id",)))
    assert evolution_problem(upsert, upsert) is None
    for before, after in [
        (log, upsert),
        (upsert, log),
        (upsert, replace(upsert, table=replace(upsert.table, key=("id", "ts")))),
        (upsert, replace(upsert, table=replace(upsert.table, envelope=Envelope.DEBEZIUM))),
    ]:
        problem = evolution_problem(before, after)
        assert problem is not None and "apply it as a new source" in problem
