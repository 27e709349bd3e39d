"""Source specs: the TOML a user applies with ``ingest source apply FILE``, parsed and validated
into a SourceSpec (ingest.spec.model); with ``schema_from = "registry"``, completed from the
registry when applied.

Validation happens here, before anything starts; every error names the field and
the allowed values.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from ingest.errors import ConfigError, shown
from ingest.formats.avro import avro_columns, avro_reader_schema
from ingest.formats.json_schema import json_schema_columns
from ingest.formats.protobuf_fields import PROTOBUF_SCALARS, protobuf_type_problem
from ingest.formats.registry import RegistrySettings, SchemaFrom, latest_schema, registry_from_dict
from ingest.formats.types import column_type
from ingest.formats.wire import FORMATS, FRAMED_FORMATS, KAFKA_TIMESTAMP, KEY_COLUMN_PREFIX, KEY_FORMATS
from ingest.spec.model import (
    CompactionSettings,
    OutOfRangePolicy,
    ParseErrorPolicy,
    SourceSpec,
    SplitLimits,
)
from ingest.spec.table import OP_COLUMN, Envelope, TableSettings, table_from_dict
from ingest.topics import TOPIC_NAME_RE, topics_from_dict
from ingest_common.errors import refuse_unknown_fields
from ingest_common.model import PartitionBy, StartFrom
from ingest_common.store_uri import canonical_store_uri

# Every pattern is matched whole (fullmatch): "$" would also accept a trailing newline.
_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# Column names become Parquet field names; keep them plain and free of the reserved prefix.
_COLUMN_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_SIZE_RE = re.compile(r" *(\d{1,15}(?:\.\d{1,9})?) *(b|kb|kib|mb|mib|gb|gib)? *", re.IGNORECASE)
_DURATION_RE = re.compile(r" *(\d{1,15}(?:\.\d{1,9})?) *(ms|s|m|h)? *", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

_TOP_LEVEL_KEYS = {
    "name",
    "topics",
    "topic_pattern",
    "start_from",
    "format",
    "schema",
    "event_time",
    "split",
    "segment_store",
    "on_parse_error",
    "consumer_group",
    "on_offset_out_of_range",
    "file_partition",
    "registry",
    "schema_from",
    "key_format",
    "key_schema",
    "compaction",
    "table",
}
_SPLIT_KEYS = {"max_records", "max_bytes", "max_age", "max_in_flight", "max_in_flight_bytes"}
_COMPACTION_KEYS = {"target_file_size"}


def validate_source_name(name: object) -> str:
    """Source names become directory names and SQL values; allow a safe subset only."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"name: {shown(name)} is not a valid source name (lower-case letter first, then up to 62 of a-z 0-9 _ -)"
        )
    return name


# Bounds for numbers in a spec: anything larger is a typo, and would overflow later.
_MAX_COUNT = 10**15
_MAX_DURATION_S = 10.0**9  # ~31 years


def parse_size(field: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(f'{field}: expected a byte size like 67108864 or "64MiB", got {shown(value)}')
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE_RE.fullmatch(value)):
        size = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()])
    else:
        raise ConfigError(f'{field}: expected a byte size like 67108864 or "64MiB", got {shown(value)}')
    if size <= 0:
        raise ConfigError(f"{field}: must be positive, got {shown(value)}")
    if size > _MAX_COUNT:
        raise ConfigError(f"{field}: at most {_MAX_COUNT} bytes, got {shown(value)}")
    return size


def parse_duration(field: str, value: object) -> float:
    if isinstance(value, bool):
        raise ConfigError(f'{field}: expected a duration like 30 or "30s", "500ms", "5m", got {shown(value)}')
    if isinstance(value, int) and abs(value) > _MAX_DURATION_S:
        raise ConfigError(f"{field}: too large, got {shown(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    else:
        raise ConfigError(f'{field}: expected a duration like 30 or "30s", "500ms", "5m", got {shown(value)}')
    if not math.isfinite(seconds) or seconds > _MAX_DURATION_S:
        raise ConfigError(f"{field}: expected a finite duration of at most {_MAX_DURATION_S:.0f} s, got {shown(value)}")
    if seconds <= 0:
        raise ConfigError(f"{field}: must be positive, got {shown(value)}")
    return seconds


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_COUNT:
        raise ConfigError(f"{field}: expected a positive integer up to {_MAX_COUNT}, got {shown(value)}")
    return value


def _choice(field: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{field}: {shown(value)} is not one of {', '.join(allowed)}")
    return value


def spec_from_dict(doc: dict[str, Any], base_dir: Path | None = None) -> SourceSpec:
    refuse_unknown_fields("", doc, _TOP_LEVEL_KEYS)
    schema_from = _choice("schema_from", doc.get("schema_from", "spec"), ("spec", "registry"))
    fmt = _choice("format", doc.get("format", "json"), FORMATS)
    for required in ("name", "event_time", *(("schema",) if schema_from == "spec" else ())):
        if required not in doc:
            raise ConfigError(f"{required}: missing (required)")
    name = validate_source_name(doc["name"])

    topics, topic_pattern = topics_from_dict(doc)

    registry = registry_from_dict(doc["registry"]) if "registry" in doc else None
    if topic_pattern and schema_from == "registry" and (registry is None or registry.subject_strategy != "record"):
        raise ConfigError(
            'schema_from = "registry" with topic_pattern: needs subject_strategy = "record" in [registry] '
            "(one subject, whatever topics match later)"
        )
    if fmt in FRAMED_FORMATS and registry is None:
        raise ConfigError(f'format = "{fmt}": needs a [registry] section with url = the schema registry\'s URL')
    if schema_from == "registry":
        if fmt not in ("avro", "json_schema"):
            raise ConfigError('schema_from = "registry": only with format = "avro" or "json_schema"')
        if "schema" in doc:
            raise ConfigError('schema: not allowed with schema_from = "registry" (the columns come from the registry)')
        columns: list[tuple[str, str]] = []
    else:
        columns = _columns(doc["schema"])
    key_format, key_columns = _key_format(doc, registry)
    event_time = doc["event_time"]
    if not isinstance(event_time, str):
        raise ConfigError(f"event_time: expected the name of a timestamp column, got {shown(event_time)}")
    if columns:
        _check_event_time(tuple(columns), event_time)
    _check_format_types(fmt, columns)

    split_doc = doc.get("split", {})
    if not isinstance(split_doc, dict):
        raise ConfigError("split: expected a table")
    refuse_unknown_fields("split", split_doc, _SPLIT_KEYS)
    defaults = SplitLimits()
    limits = SplitLimits(
        max_records=_positive_int("split.max_records", split_doc.get("max_records", defaults.max_records)),
        max_bytes=parse_size("split.max_bytes", split_doc.get("max_bytes", defaults.max_bytes)),
        max_age_s=parse_duration("split.max_age", split_doc.get("max_age", defaults.max_age_s)),
        max_in_flight=_positive_int("split.max_in_flight", split_doc.get("max_in_flight", defaults.max_in_flight)),
        max_in_flight_bytes=parse_size(
            "split.max_in_flight_bytes", split_doc.get("max_in_flight_bytes", defaults.max_in_flight_bytes)
        ),
    )

    compaction_doc = doc.get("compaction", {})
    if not isinstance(compaction_doc, dict):
        raise ConfigError("compaction: expected a table")
    refuse_unknown_fields("compaction", compaction_doc, _COMPACTION_KEYS)
    compaction = CompactionSettings(
        target_file_bytes=parse_size(
            "compaction.target_file_size",
            compaction_doc.get("target_file_size", CompactionSettings().target_file_bytes),
        )
    )

    group = doc.get("consumer_group", "")
    if not isinstance(group, str) or (group and not TOPIC_NAME_RE.fullmatch(group)):
        raise ConfigError(
            f"consumer_group: expected a Kafka group id of letters, digits, '.', '_' and '-', got {shown(group)}"
        )

    spec = SourceSpec(
        name=name,
        topics=tuple(topics),
        topic_pattern=topic_pattern,
        schema=tuple(columns),
        event_time=event_time,
        segment_store=canonical_store_uri(
            doc.get("segment_store", "file:///var/lib/ingest/segments"), base_dir=base_dir
        ),
        start_from=cast(StartFrom, _choice("start_from", doc.get("start_from", "earliest"), ("earliest", "latest"))),
        format=fmt,
        registry=registry,
        schema_from=cast(SchemaFrom, schema_from),
        reader_schema=avro_reader_schema(tuple(columns)) if fmt == "avro" and columns else "",
        key_format=key_format,
        key_schema=tuple(key_columns),
        on_parse_error=cast(
            ParseErrorPolicy, _choice("on_parse_error", doc.get("on_parse_error", "reject"), ("reject", "skip", "fail"))
        ),
        split=limits,
        consumer_group=group,
        on_offset_out_of_range=cast(
            OutOfRangePolicy,
            _choice("on_offset_out_of_range", doc.get("on_offset_out_of_range", "fail"), ("fail", "earliest")),
        ),
        file_partition=PartitionBy(
            _choice("file_partition", doc.get("file_partition", "none"), tuple(p.value for p in PartitionBy))
        ),
        compaction=compaction,
        table=table_from_dict(doc["table"]) if "table" in doc else TableSettings(),
    )
    check_upsert(spec)
    return spec


def _key_format(doc: dict[str, Any], registry: RegistrySettings | None) -> tuple[str, list[tuple[str, str]]]:
    """``key_format`` and the fields of ``[key_schema]`` (required by, and only allowed with,
    the framed key formats)."""
    key_format = _choice("key_format", doc.get("key_format", "binary"), KEY_FORMATS)
    if key_format not in FRAMED_FORMATS:
        if "key_schema" in doc:
            raise ConfigError(f'key_schema: only with key_format = "avro" or "json_schema", not "{key_format}"')
        return key_format, []
    if registry is None:
        raise ConfigError(
            f'key_format = "{key_format}": needs a [registry] section with url = the schema registry\'s URL'
        )
    if "key_schema" not in doc:
        raise ConfigError(f'key_schema: missing (required with key_format = "{key_format}": the key\'s fields)')
    return key_format, _columns(doc["key_schema"], "key_schema")


def _columns(schema: object, field: str = "schema") -> list[tuple[str, str]]:
    if not isinstance(schema, dict) or not schema:
        raise ConfigError(f"{field}: expected a table of column = type with at least one column")
    columns: list[tuple[str, str]] = []
    for column, ctype in schema.items():
        if not _COLUMN_RE.fullmatch(column):
            raise ConfigError(
                f"{field}.{column}: invalid column name (letter first, then letters, digits, _; "
                "names starting with _ are reserved for _topic, _partition, _offset, _timestamp, _key)"
            )
        columns.append((column, column_type(f"{field}.{column}", ctype)))
    if len({c.lower() for c, _ in columns}) != len(columns):
        raise ConfigError(f"{field}: column names must be unique ignoring case")
    return columns


def _check_event_time(columns: tuple[tuple[str, str], ...], event_time: str) -> None:
    """``event_time`` names a timestamp column, or the Kafka record's timestamp."""
    if event_time == KAFKA_TIMESTAMP:
        return
    types = dict(columns)
    if event_time not in types:
        raise ConfigError(
            f"event_time: {shown(event_time)} is not a column of [schema] "
            f'(or "{KAFKA_TIMESTAMP}": the Kafka record\'s timestamp)'
        )
    if types[event_time] != "timestamp":
        raise ConfigError(
            f"event_time: column {shown(event_time)} must have type timestamp, has {types[event_time]} "
            f'(or use "{KAFKA_TIMESTAMP}": the Kafka record\'s timestamp)'
        )


def _check_format_types(fmt: str, columns: list[tuple[str, str]]) -> None:
    """Format protobuf decodes into its scalar column types and arrays, maps and structs of them."""
    if fmt != "protobuf":
        return
    for column, ctype in columns:
        problem = protobuf_type_problem(ctype)
        if problem is not None:
            raise ConfigError(
                f'schema.{column}: type {ctype} is not read from format = "protobuf" ({problem}: no Protobuf '
                f"field is read into it; its types: {', '.join(PROTOBUF_SCALARS)} and arrays, maps, structs of them)"
            )


def check_upsert(spec: SourceSpec) -> None:
    """An upsert source's ``[table]`` against the rest of its spec: its key names output
    columns (a value column, or a decoded key's ``_key_...``), no column is the segments'
    change column, the Debezium envelope is read from JSON only, and without an envelope every
    key column can be read from the Kafka key (a tombstone has nothing else). The column checks
    wait for the columns (``schema_from = "registry"``: resolve_registry_schema)."""
    table = spec.table
    if not table.upsert:
        return
    if table.external:
        # The merges run on the metastore's catalog through Iceberg's JDBC catalog (ingest.table.merge).
        raise ConfigError(
            'table.mode = "upsert": supported in the metastore\'s Iceberg catalog only, not with table.catalog '
            "(an append table may live in a catalog of your own)"
        )
    if table.envelope is Envelope.DEBEZIUM and spec.format != "json":
        raise ConfigError(
            f'table.envelope = "debezium": supported for format = "json" only, not "{spec.format}" '
            "(Debezium's JSON converter, with or without schemas.enable)"
        )
    if not spec.schema:
        return
    values = {name for name, _ in spec.schema}
    decoded = {name for name, _ in spec.key_columns}
    if any(name.lower() == OP_COLUMN for name in values | decoded):
        raise ConfigError(
            f'schema: no column may be named {OP_COLUMN} with mode = "upsert" (the segments\' change column)'
        )
    for column in table.key:
        if column not in values | decoded:
            known = ", ".join([*(n for n, _ in spec.key_columns), *(n for n, _ in spec.schema)])
            raise ConfigError(f"table.key: {shown(column)} is not a column of the spec's rows ({known})")
        if table.envelope is Envelope.NONE and column not in decoded and KEY_COLUMN_PREFIX + column not in decoded:
            raise ConfigError(
                f"table.key: {shown(column)} cannot be read from the Kafka key: a tombstone (null value) "
                f"carries only the key, so decode it (key_format and key_schema with field {column!r}, "
                f"giving {KEY_COLUMN_PREFIX}{column}) or key the table on {KEY_COLUMN_PREFIX}... columns"
            )


def resolve_registry_schema(spec: SourceSpec) -> SourceSpec:
    """With ``schema_from = "registry"``, the spec with its reader schema and columns taken from
    the latest version of its topics' subjects, as applied: later versions reach the spec only
    through another ``source apply``. Every topic's subject must give the same fields (one
    reader schema for the source's segments and table), else the spec is refused. Any other
    spec is returned as it is."""
    if spec.schema_from != "registry" or spec.registry is None:
        return spec
    latest: dict[str, str] = {}
    avro = spec.format == "avro"
    # A pattern source has one subject (subject_strategy = "record", spec_from_dict), whatever the topic.
    for topic in spec.topics or (spec.topic_pattern,):
        subject = spec.registry.subject(topic)
        if subject not in latest:
            latest[subject] = latest_schema(spec.registry, topic, "AVRO" if avro else "JSON")
    (first, schema), *others = latest.items()
    fields = _fields if avro else json_schema_columns
    for subject, other in others:
        if fields(other) != fields(schema):
            raise ConfigError(
                f"schema_from = registry: the latest schemas of subjects {first!r} and {subject!r} have "
                "different fields; every topic's subject must give one reader schema "
                '(or use subject_strategy = "record", or a [schema] table)'
            )
    columns = avro_columns(schema) if avro else json_schema_columns(schema)
    for column, _ in columns:
        if not _COLUMN_RE.fullmatch(column):
            raise ConfigError(f"schema_from = registry: field {column!r} is not a valid column name")
    _check_event_time(columns, spec.event_time)
    # A JSON Schema source's records are read as format json reads them: no reader schema.
    resolved = replace(spec, schema=columns, reader_schema=schema if avro else "")
    check_upsert(resolved)
    return resolved


def _fields(schema: str) -> str:
    """An Avro record schema's fields in one canonical text (names, types, defaults, order)."""
    doc = json.loads(schema)
    return json.dumps(doc.get("fields") if isinstance(doc, dict) else doc, sort_keys=True)


def load_spec_file(path: Path) -> tuple[SourceSpec, str]:
    """Parse and validate a TOML spec file; returns the spec and the file's text."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read spec file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"spec file {path} is not UTF-8 text") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"spec file {path} is not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"spec file {path}: arrays or tables nested too deeply") from None
    return spec_from_dict(doc, base_dir=path.resolve().parent), text
