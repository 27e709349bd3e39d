from pathlib import Path
from typing import Any

import pytest

from ingest.errors import ConfigError
from ingest.spec.model import SourceSpec
from ingest.spec.parse import load_spec_file, spec_from_dict


def base(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "clicks",
        "topics": ["clicks"],
        "event_time": "ts",
        "segment_store": "file:///tmp/segments",
        "schema": {"user": "string", "ts": "timestamp", "amount": "double", "tags": "array<string>"},
        "split": {"max_records": 1000, "max_bytes": "1MiB", "max_age": "500ms"},
    }
    doc.update(over)
    return doc


def test_a_valid_spec_round_trips_through_json() -> None:
    spec = spec_from_dict(base())
    assert spec.split.max_bytes == 1024**2 and spec.split.max_age_s == 0.5
    assert spec.group_id == "ingest-clicks"
    assert SourceSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "../etc"}, "name"),
        ({"topics": []}, "topics"),
        ({"topics": ["ok", "ok"]}, "topics"),
        ({"topics": ["bad topic"]}, "topics"),
        ({"schema": {"ts": "timestamp", "x": "decimal"}}, "schema.x"),
        ({"schema": {"ts": "timestamp", "_offset": "long"}}, "schema._offset"),
        ({"event_time": "nope"}, "event_time"),
        ({"event_time": "user"}, "event_time"),
        ({"start_from": "middle"}, "start_from"),
        ({"format": "avro"}, "format"),
        ({"on_parse_error": "ignore"}, "on_parse_error"),
        ({"split": {"max_records": 0}}, "split.max_records"),
        ({"split": {"max_bytes": "lots"}}, "split.max_bytes"),
        ({"split": {"max_age": -1}}, "split.max_age"),
        ({"split": {"max_rows": 5}}, "split"),
        ({"segment_store": "file://relative/path"}, "segment_store"),
        # Matched whole: "$" in a pattern would accept these trailing newlines.
        ({"name": "clicks\n"}, "name"),
        ({"topics": ["clicks\n"]}, "topics"),
        ({"schema": {"ts": "timestamp", "user\n": "string"}}, "schema.user"),
        ({"split": {"max_bytes": "1MiB\n"}}, "split.max_bytes"),
        ({"split": {"max_age": "5s\n"}}, "split.max_age"),
        ({"split": {"max_bytes": "9" * 400}}, "split.max_bytes"),
        ({"consumer_group": "group\n"}, "consumer_group"),
        ({"consumer_group": "two words"}, "consumer_group"),
        ({"surprise": 1}, "unknown field"),
    ],
)
def test_invalid_specs_name_the_field(override: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        spec_from_dict(base(**override))


def test_missing_required_field() -> None:
    doc = base()
    del doc["event_time"]
    with pytest.raises(ConfigError, match="event_time: missing"):
        spec_from_dict(doc)


def test_spec_files_relative_store_and_toml_errors(tmp_path: Path) -> None:
    good = tmp_path / "s.toml"
    good.write_text(
        'name = "s"\ntopics = ["t"]\nevent_time = "ts"\nsegment_store = "data/seg"\n[schema]\nts = "timestamp"\n'
    )
    spec, text = load_spec_file(good)
    assert spec.segment_store == "file://" + str(tmp_path / "data" / "seg")
    assert "[schema]" in text
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_spec_file(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec_file(tmp_path / "missing.toml")


HOSTILE_BASE = {
    "name": "x",
    "topics": ["t"],
    "event_time": "ts",
    "segment_store": "/tmp/s",
    "schema": {"ts": "timestamp"},
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("event_time", ["ts"]),
        ("event_time", {"column": "ts"}),
        ("event_time", 7),
        ("consumer_group", 10**400),
        ("segment_store", 10**400),
        ("name", "x" * 500),
    ],
)
def test_hostile_top_level_values_are_one_short_line(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        spec_from_dict({**HOSTILE_BASE, field: value})
    assert str(err.value).startswith(field) and len(str(err.value)) < 300


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_records", 10**400),
        ("max_bytes", 10**400),
        ("max_bytes", "9" * 400),
        ("max_in_flight_bytes", 10**16),
        ("max_age", 10**400),
        ("max_age", float("inf")),
        ("max_age", float("nan")),
        ("max_age", "1e400"),
    ],
)
def test_huge_or_non_finite_numbers_are_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        spec_from_dict({**HOSTILE_BASE, "split": {field: value}})
    assert f"split.{field}" in str(err.value) and len(str(err.value)) < 300


def test_deeply_nested_toml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nested.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_spec_file(path)


REGISTRY = {"url": "http://127.0.0.1:8081"}


def test_key_formats_and_their_columns_round_trip() -> None:
    binary = spec_from_dict(base())
    assert (binary.key_format, binary.key_columns) == ("binary", ())
    text = spec_from_dict(base(key_format="string"))
    assert text.key_columns == (("_key_string", "string"),)
    avro = spec_from_dict(base(key_format="avro", key_schema={"id": "long", "Region": "STRING"}, registry=REGISTRY))
    assert avro.key_schema == (("id", "long"), ("Region", "string"))
    assert avro.key_columns == (("_key_id", "long"), ("_key_Region", "string"))
    for spec in (binary, text, avro):
        assert SourceSpec.from_json(spec.to_json()) == spec
    # A spec stored before key formats existed reads as binary keys.
    old = binary.to_json()
    del old["key_format"], old["key_schema"]
    assert SourceSpec.from_json(old) == binary


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"key_format": "protobuf"}, "key_format: 'protobuf' is not one of binary, string, avro, json_schema"),
        ({"key_format": "avro", "key_schema": {"id": "long"}}, 'key_format = "avro": needs a \\[registry\\]'),
        ({"key_format": "json_schema", "registry": REGISTRY}, "key_schema: missing \\(required with key_format"),
        ({"key_format": "string", "key_schema": {"id": "long"}}, 'key_schema: only with key_format = "avro"'),
        ({"key_schema": {"id": "long"}}, 'key_schema: only with key_format = "avro" or "json_schema", not "binary"'),
        ({"key_format": "avro", "key_schema": {}, "registry": REGISTRY}, "key_schema: expected a table"),
        ({"key_format": "avro", "key_schema": {"_id": "long"}, "registry": REGISTRY}, "key_schema._id: invalid"),
        ({"key_format": "avro", "key_schema": {"id": "decimal"}, "registry": REGISTRY}, "key_schema.id: type"),
        ({"key_format": "avro", "key_schema": {"a": "long", "A": "int"}, "registry": REGISTRY}, "key_schema: column"),
    ],
)
def test_invalid_key_formats_name_the_field(override: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        spec_from_dict(base(**override))


def test_compaction_target_is_a_size_defaulting_to_256_mib_and_stored_specs_without_it_read_back() -> None:
    assert spec_from_dict(base()).compaction.target_file_bytes == 256 * 1024**2
    spec = spec_from_dict(base(compaction={"target_file_size": "64MiB"}))
    assert spec.compaction.target_file_bytes == 64 * 1024**2
    assert SourceSpec.from_json(spec.to_json()) == spec
    stored = spec.to_json()
    del stored["compaction"]  # applied before compaction existed
    assert SourceSpec.from_json(stored).compaction.target_file_bytes == 256 * 1024**2
    for bad, field in (({"target_file_size": 0}, "compaction.target_file_size"), ({"target": 1}, "compaction")):
        with pytest.raises(ConfigError, match=field):
            spec_from_dict(base(compaction=bad))


def pattern_doc(**over: Any) -> dict[str, Any]:
    doc = base(**{"topic_pattern": r"^orders\..*", **over})
    del doc["topics"]
    return doc


def test_a_topic_pattern_spec_round_trips_and_matches_like_a_kafka_subscription() -> None:
    spec = spec_from_dict(pattern_doc())
    assert spec.topics == () and spec.subscription == [r"^(orders\..*)$"]
    assert SourceSpec.from_json(spec.to_json()) == spec
    assert spec.matches("orders.eu") and spec.matches("orders.us")
    assert not spec.matches("payments.eu") and not spec.matches("ordersXeu")
    # The whole name, as the broker (KIP-848) and Kafka's Java clients match: not a prefix.
    prefix = spec_from_dict(pattern_doc(topic_pattern=r"^orders\."))
    assert not prefix.matches("orders.eu") and prefix.subscription == [r"^(orders\.)$"]
    ends = spec_from_dict(pattern_doc(topic_pattern=r"^orders\.(eu|us)$"))
    assert ends.matches("orders.us") and not ends.matches("orders.usa")
    assert ends.subscription == [r"^(orders\.(eu|us))$"]
    # Internal topics never match, whatever the pattern.
    assert not spec_from_dict(pattern_doc(topic_pattern="^.*")).matches("__consumer_offsets")
    assert spec_from_dict(pattern_doc(topic_pattern="^.*")).matches("clicks")
    named = spec_from_dict(base())
    assert named.subscription == ["clicks"] and named.matches("clicks") and not named.matches("clicks2")
    # Specs stored before topic_pattern existed read back as named-topic specs.
    doc = named.to_json()
    del doc["topic_pattern"]
    assert SourceSpec.from_json(doc) == named


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (base(topic_pattern="^orders"), "topics / topic_pattern: give exactly one"),
        ({k: v for k, v in base().items() if k != "topics"}, "topics / topic_pattern: give exactly one"),
        (pattern_doc(topic_pattern="orders\\..*"), 'topic_pattern: expected a regex starting with "^"'),
        (pattern_doc(topic_pattern=["^orders"]), 'topic_pattern: expected a regex starting with "^"'),
        (pattern_doc(topic_pattern="^orders(["), "topic_pattern: '^orders([' is not a valid regex"),
        (pattern_doc(topic_pattern="^(?:orders).*"), "topic_pattern: '^(?:orders).*': (?...) groups"),
        (
            pattern_doc(schema_from="registry", format="avro", registry={"url": "http://r"}),
            'schema_from = "registry" with topic_pattern: needs subject_strategy = "record"',
        ),
    ],
)
def test_topic_pattern_rules_are_one_line_config_errors(doc: dict[str, Any], message: str) -> None:
    if doc.get("schema_from") == "registry":
        del doc["schema"]
    with pytest.raises(ConfigError) as err:
        spec_from_dict(doc)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_change_of_pattern_is_a_change_of_subscription() -> None:
    # ingest.consume.controls compares subscriptions: a new pattern needs a restart, as new topics do.
    assert (
        spec_from_dict(pattern_doc()).subscription != spec_from_dict(pattern_doc(topic_pattern="^orders")).subscription
    )
    assert spec_from_dict(pattern_doc()).subscription != spec_from_dict(base()).subscription
