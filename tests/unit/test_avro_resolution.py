"""Avro schema resolution checked before decoding (ingest.formats.avro_resolution): the specification's
rules for records, defaults, promotions, unions, arrays, maps, enums, fixed and named types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.formats.avro import avro_reader_schema, decode_schemas
from ingest.formats.avro_resolution import resolution_problem


def record(*fields: dict[str, Any], name: str = "Order") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "acme", "fields": list(fields)})


def field(name: str, avro: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": avro, **extra}


TS = {"type": "long", "logicalType": "timestamp-millis"}
V1 = record(field("id", "long"), field("ts", TS), field("amount", "double"))
V2 = record(field("id", "long"), field("ts", TS), field("amount", "double"), field("region", "string", default="eu"))


def test_added_fields_with_defaults_and_removed_fields_resolve_both_ways() -> None:
    assert resolution_problem(V1, V2) is None
    assert resolution_problem(V2, V1) is None


def test_a_reader_field_without_default_that_the_writer_lacks_is_unresolvable() -> None:
    reader = record(field("id", "long"), field("ts", TS), field("amount", "double"), field("region", "string"))
    assert resolution_problem(V1, reader) == "field 'region': the reader's field has no default and the writer lacks it"
    # The writer having it under one of the reader field's aliases is enough.
    aliased = record(field("id", "long"), field("when", TS, aliases=["ts"]), field("amount", "double"))
    assert resolution_problem(V1, aliased) is None


@pytest.mark.parametrize(
    ("written", "read", "ok"),
    [
        ("int", "long", True),
        ("int", "double", True),
        ("long", "float", True),
        ("float", "double", True),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("long", "int", False),
        ("double", "float", False),
        ("string", "long", False),
        ("boolean", "string", False),
        ("int", "string", False),
        (TS, "long", True),  # logical types ride on their base type
        ("long", {"type": "long", "logicalType": "timestamp-micros"}, True),
        ("string", TS, False),
    ],
)
def test_primitives_resolve_when_equal_or_promoted(written: Any, read: Any, ok: bool) -> None:
    problem = resolution_problem(record(field("x", written)), record(field("x", read)))
    assert (problem is None) == ok, problem
    if not ok:
        assert problem is not None and problem.startswith("field 'x': the writer's ")


def test_unions_every_writer_branch_must_resolve_some_reader_branch() -> None:
    def ok(written: Any, read: Any) -> bool:
        return resolution_problem(record(field("x", written)), record(field("x", read))) is None

    assert ok("long", ["null", "long"])
    assert ok(["null", "int"], ["null", "long"])
    assert ok(["null", "string"], ["string", "null"])
    assert not ok(["null", "string"], ["null", "long"])
    # A null the reader cannot hold: the writer as a whole is refused.
    assert not ok(["null", "long"], "long")
    assert ok(["int", "long"], "long")


def test_arrays_maps_enums_and_fixed() -> None:
    def problem(written: Any, read: Any) -> str | None:
        return resolution_problem(record(field("x", written)), record(field("x", read)))

    assert problem({"type": "array", "items": "int"}, {"type": "array", "items": ["null", "long"]}) is None
    assert problem({"type": "array", "items": "string"}, {"type": "array", "items": "long"}) == (
        "field 'x[]': the writer's string cannot be read as long"
    )
    assert problem({"type": "map", "values": "string"}, {"type": "array", "items": "string"}) is not None
    assert problem({"type": "map", "values": "float"}, {"type": "map", "values": "double"}) is None
    colours = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}
    fewer = {**colours, "symbols": ["RED"]}
    assert problem(fewer, colours) is None
    assert problem(colours, fewer) == "field 'x': the reader's enum lacks the symbol(s) GREEN"
    assert problem(colours, {**fewer, "default": "RED"}) is None
    assert problem(colours, "string") is not None
    md5 = {"type": "fixed", "name": "MD5", "size": 16}
    assert problem(md5, md5) is None
    assert problem(md5, {**md5, "size": 8}) is not None
    assert problem(md5, {**md5, "name": "SHA"}) is not None


def test_named_references_nested_and_recursive_records() -> None:
    address = {"type": "record", "name": "Address", "fields": [field("city", "string")]}
    writer = record(field("home", address), field("work", "acme.Address"))
    reader_ok = record(field("home", address), field("work", "Address"))
    assert resolution_problem(writer, reader_ok) is None
    zips = {"type": "record", "name": "Address", "fields": [field("city", "string"), field("zip", "int")]}
    problem = resolution_problem(writer, record(field("home", zips)))
    assert problem == "field 'home.zip': the reader's field has no default and the writer lacks it"
    renamed = {**address, "name": "Place"}
    assert resolution_problem(writer, record(field("home", renamed))) is not None
    node = json.dumps(
        {"type": "record", "name": "Node", "fields": [field("v", "int"), field("next", ["null", "Node"])]}
    )
    assert resolution_problem(node, node.replace('"v", "type": "int"', '"v", "type": "long"')) is None
    assert resolution_problem(node.replace('"int"', '"string"'), node) is not None


def test_a_spec_reader_resolves_any_writer_whose_common_fields_have_compatible_types() -> None:
    """The spec's reader: every column nullable with a null default, named like the writer."""
    spec_reader = avro_reader_schema((("id", "long"), ("ts", "timestamp"), ("region", "string")))
    assert resolution_problem(*decode_schemas(spec_reader, V1)) is None
    assert resolution_problem(*decode_schemas(spec_reader, V2)) is None
    changed = V2.replace('"region", "type": "string"', '"region", "type": "long"')
    problem = resolution_problem(*decode_schemas(spec_reader, changed))
    assert problem == "field 'region': the writer's long matches no branch of the reader's union[null, string]"


def test_text_that_is_not_a_schema_is_a_problem_not_an_exception() -> None:
    assert resolution_problem("{not json", V1) is not None
    assert resolution_problem(json.dumps({"type": "record", "name": "Order"}), V1) is not None
    missing = record(field("x", "acme.Missing"))
    assert resolution_problem(missing, missing) == "unknown type name 'acme.Missing'"
