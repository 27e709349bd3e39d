"""Column types (ingest.formats.types): what a spec may say, its one spelling, the type
changes a source's next version may make, and an event time from the Kafka record."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.errors import ConfigError
from ingest.formats.types import canonical, column_type, parse_type, spark_type, widens
from ingest.spec.evolution import evolution_problem
from ingest.spec.parse import spec_from_dict


@pytest.mark.parametrize(
    ("text", "spelled"),
    [
        ("STRING", "string"),
        ("bigint", "long"),
        ("decimal( 12 , 3 )", "decimal(12,3)"),
        ("decimal(7)", "decimal(7,0)"),
        ("array< struct<a:int, B_2:array<timestamp_ntz>> >", "array<struct<a:int,B_2:array<timestamp_ntz>>>"),
        ("map<string,map<string,binary>>", "map<string,map<string,binary>>"),
        ("struct<_private:date>", "struct<_private:date>"),
    ],
)
def test_every_type_has_one_spelling(text: str, spelled: str) -> None:
    assert canonical(parse_type(text)) == spelled
    assert canonical(parse_type(spelled)) == spelled


def test_the_spark_type_holds_the_nesting() -> None:
    assert spark_type("struct<a:decimal(20,4),m:map<string,array<timestamp>>>").simpleString() == (
        "struct<a:decimal(20,4),m:map<string,array<timestamp>>>"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("decimal", "precision and scale"),
        ("decimal(39,1)", "1 <= precision <= 38"),
        ("decimal(5,6)", "scale <= precision"),
        ("array<int", "expected >"),
        ("struct<a:int,A:long>", "unique ignoring case"),
        ("map<array<int>,int>", "map keys must be a scalar"),
        ("varchar", "unknown type 'varchar'"),
        ("int extra", "after the type"),
        ("struct<a-b:int>", "unexpected"),
    ],
)
def test_a_type_that_is_none_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"schema.x: type .* is not a column type .*{why}"):
        column_type("schema.x", text)


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        ("int", "long", True),
        ("long", "int", False),
        ("decimal(10,2)", "decimal(12,2)", True),
        ("decimal(10,2)", "decimal(12,3)", False),
        ("struct<a:int>", "struct<a:long,b:string>", True),
        ("struct<a:int,b:string>", "struct<a:int>", False),
        ("array<struct<a:float>>", "array<struct<a:double,c:date>>", True),
        ("map<string,int>", "map<string,long>", True),
        ("timestamp", "timestamp_ntz", False),
    ],
)
def test_widening_follows_what_iceberg_and_parquet_readers_accept(old: str, new: str, allowed: bool) -> None:
    assert widens(old, new) is allowed


def _spec(schema: dict[str, str], **over: Any) -> Any:
    return spec_from_dict(
        {
            "name": "orders",
            "topics": ["orders"],
            "event_time": "ts",
            "segment_store": "file:///tmp/segments",
            "format": "avro",
            "schema": {"ts": "timestamp", **schema},
            "registry": {"url": "http://127.0.0.1:8081"},
            **over,
        }
    )


def test_a_nested_field_may_be_added_but_not_changed() -> None:
    before = _spec({"address": "struct<city:string>"})
    assert evolution_problem(before, _spec({"address": "struct<city:string,zip:long>"})) is None
    problem = evolution_problem(before, _spec({"address": "struct<city:long>"}))
    assert problem is not None and "changes type from struct<city:string> to struct<city:long>" in problem


def test_the_event_time_may_be_the_kafka_timestamp_and_says_so_when_it_is_not_a_timestamp() -> None:
    spec = _spec({"n": "long"}, event_time="_timestamp")
    assert spec.event_time == "_timestamp"
    with pytest.raises(ConfigError, match=r'must have type timestamp, has long .*or use "_timestamp"'):
        _spec({"n": "long"}, event_time="n")


def test_protobuf_refuses_the_types_its_decoder_does_not_fill() -> None:
    with pytest.raises(
        ConfigError, match=r'schema\.a: type struct<b:decimal\(5,1\)> is not read from format = "protobuf"'
    ):
        _spec({"a": "struct<b:decimal(5,1)>"}, format="protobuf")
    assert _spec({"a": "map<string,array<struct<b:binary>>>"}, format="protobuf").schema[1][1] == (
        "map<string,array<struct<b:binary>>>"
    )
