"""Record formats behind a schema registry: the Confluent wire format (a zero magic byte, a
4-byte big-endian schema id, then the body; for Protobuf a message-index list before it,
ingest.builder.protobuf_decode), the ``[registry]`` section of a spec, the Avro reader schema
of a spec and the registry client.

Only the Confluent Schema Registry REST API is used (any registry that speaks it will do).
Credentials come from the environment only (``INGEST_SCHEMA_REGISTRY_USER_INFO``, or a file
named by ``INGEST_SCHEMA_REGISTRY_USER_INFO_FILE``; redacted with the other secrets by
ingest.config), never from a spec, which the metastore stores and ``source history`` shows.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from ingest.env_files import env_value
from ingest.errors import ConfigError, shown

#: Formats of a spec; all but json are framed (Confluent wire format).
FORMATS = ("json", "avro", "json_schema", "protobuf")
FRAMED_FORMATS = ("avro", "json_schema", "protobuf")
#: What a record's key is decoded as (``key_format``): kept as bytes in ``_key`` only (binary),
#: UTF-8 text, or a framed format read with the spec's ``[key_schema]``. ``_key`` always stays.
KEY_FORMATS = ("binary", "string", "avro", "json_schema")
#: Decoded key fields are output columns named with this prefix; spec columns cannot start
#: with "_", so they clash with none. A string key is the one column ``_key_string``.
KEY_COLUMN_PREFIX = "_key_"
STRING_KEY_COLUMN = "_key_string"
HEADER_BYTES = 5
MAGIC_BYTE = 0
USER_INFO_ENV = "INGEST_SCHEMA_REGISTRY_USER_INFO"

SubjectStrategy = Literal["topic", "record"]
SchemaFrom = Literal["spec", "registry"]
_REGISTRY_KEYS = {"url", "subject_strategy", "record_name"}


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    url: str
    # Whose latest version ``schema_from = "registry"`` reads: ``<topic>-value``, or the
    # record's full name (``record_name``).
    subject_strategy: SubjectStrategy = "topic"
    record_name: str = ""

    def subject(self, topic: str) -> str:
        return self.record_name if self.subject_strategy == "record" else f"{topic}-value"


def registry_from_dict(doc: object) -> RegistrySettings:
    if not isinstance(doc, dict):
        raise ConfigError("registry: expected a table with url = the registry's base URL")
    unknown = set(doc) - _REGISTRY_KEYS
    if unknown:
        raise ConfigError(
            f"registry: unknown field(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_REGISTRY_KEYS))}"
        )
    if "url" not in doc:
        raise ConfigError("registry.url: missing (required: the registry's base URL)")
    url = doc["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"registry.url: expected an http:// or https:// URL, got {shown(url)}")
    if "@" in url.partition("://")[2].partition("/")[0]:
        raise ConfigError(f"registry.url: credentials go in {USER_INFO_ENV}, not in the URL")
    strategy = doc.get("subject_strategy", "topic")
    if strategy not in ("topic", "record"):
        raise ConfigError(f"registry.subject_strategy: {shown(strategy)} is not one of topic, record")
    record_name = doc.get("record_name", "")
    if not isinstance(record_name, str):
        raise ConfigError(f"registry.record_name: expected a record's full name, got {shown(record_name)}")
    if strategy == "record" and not record_name:
        raise ConfigError('registry.record_name: required with subject_strategy = "record" (the subject\'s name)')
    return RegistrySettings(url.rstrip("/"), cast(SubjectStrategy, strategy), record_name)


def schema_id(value: bytes | None) -> int | None:
    """The schema id of a Confluent-framed value, or None when it is not framed."""
    if value is None or len(value) < HEADER_BYTES or value[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(value[1:HEADER_BYTES], "big")


# -- Avro schemas


def _avro_type(ctype: str) -> Any:
    if ctype.startswith("array<"):
        return {"type": "array", "items": ["null", _avro_type(ctype[6:-1])]}
    if ctype == "timestamp":
        return {"type": "long", "logicalType": "timestamp-millis"}
    if ctype == "date":
        return {"type": "int", "logicalType": "date"}
    return ctype


def avro_reader_schema(columns: tuple[tuple[str, str], ...]) -> str:
    """The Avro reader schema of a spec's ``[schema]``: every column nullable, null by default
    (a writer without the field gives null). Timestamps are read as timestamp-millis unless a
    writer schema says micros (:func:`reader_for_writer`)."""
    fields = [{"name": name, "type": ["null", _avro_type(ctype)], "default": None} for name, ctype in columns]
    return json.dumps({"type": "record", "name": "ingest_record", "fields": fields}, separators=(",", ":"))


def _non_null(avro: Any) -> Any:
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        return branches[0] if len(branches) == 1 else avro
    return avro


def _logical(avro: Any) -> str | None:
    avro = _non_null(avro)
    return avro.get("logicalType") if isinstance(avro, dict) else None


#: A field every reader schema gets, which no writer has: its default (true) is filled in for
#: every record that decodes. Spark's from_avro in PERMISSIVE mode gives a row of nulls for a
#: body that does not decode, which this field tells apart from a record of null fields.
#: Spec columns cannot start with "_", so it clashes with none.
DECODED_FIELD = "_ingest_decoded"


def reader_for_writer(reader: str, writer: str) -> str:
    """The reader schema one writer's records are resolved to: the record's name taken from the
    writer (Avro resolves named types by name), :data:`DECODED_FIELD` added, and each top-level
    timestamp read in the writer's precision. Avro's resolution sees two longs in a millis
    writer and a micros reader (or the reverse) and would hand the value over unscaled, 1000
    times off; the Spark column is a timestamp either way, so reading the writer's precision
    loses nothing."""
    doc = copy.deepcopy(json.loads(reader))
    wdoc = json.loads(writer)
    doc["fields"] = [*doc["fields"], {"name": DECODED_FIELD, "type": "boolean", "default": True}]
    if not isinstance(wdoc, dict) or wdoc.get("type") != "record":
        return json.dumps(doc, separators=(",", ":"))
    doc["name"] = wdoc.get("name", doc.get("name"))
    if "namespace" in wdoc:
        doc["namespace"] = wdoc["namespace"]
    else:
        doc.pop("namespace", None)
    written = {f["name"]: _logical(f["type"]) for f in wdoc.get("fields", []) if isinstance(f, dict)}
    for field in doc["fields"]:
        precision = written.get(field["name"])
        if precision in _TIMESTAMPS and _logical(field["type"]) in _TIMESTAMPS:
            field["type"] = _with_logical(field["type"], precision)
    return json.dumps(doc, separators=(",", ":"))


_TIMESTAMPS = ("timestamp-millis", "timestamp-micros")


def _with_logical(avro: Any, logical: str) -> Any:
    """``avro`` (a timestamp, or a union holding one) with that timestamp's logical type set."""
    if isinstance(avro, list):
        return [_with_logical(b, logical) if _logical(b) in _TIMESTAMPS else b for b in avro]
    return {**avro, "logicalType": logical}


_AVRO_SCALARS = {"string": "string", "long": "long", "int": "int", "double": "double", "float": "float"}
_AVRO_SCALARS["boolean"] = "boolean"
_AVRO_LOGICAL = {"timestamp-millis": "timestamp", "timestamp-micros": "timestamp", "date": "date"}


def _column_type(field: str, avro: Any) -> str:
    avro = _non_null(avro)
    if isinstance(avro, dict):
        if avro.get("logicalType") in _AVRO_LOGICAL:
            return _AVRO_LOGICAL[avro["logicalType"]]
        if avro.get("type") == "array":
            inner = _column_type(field, avro.get("items"))
            if not inner.startswith("array<"):
                return f"array<{inner}>"
        elif avro.get("type") in _AVRO_SCALARS:
            return _AVRO_SCALARS[avro["type"]]
    elif isinstance(avro, str) and avro in _AVRO_SCALARS:
        return _AVRO_SCALARS[avro]
    raise ConfigError(
        f"schema_from = registry: field {field!r} has Avro type {json.dumps(avro)}, which has no column type "
        "(supported: string, long, int, double, float, boolean, timestamp-millis/micros, date, arrays of those)"
    )


def avro_columns(schema: str) -> tuple[tuple[str, str], ...]:
    """A registry's Avro record schema as the spec's columns."""
    doc = json.loads(schema)
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ConfigError("schema_from = registry: the registry's schema is not an Avro record")
    return tuple((f["name"], _column_type(f["name"], f["type"])) for f in doc.get("fields", []))


# -- the registry client


def registry_client(settings: RegistrySettings, env: Mapping[str, str] | None = None) -> Any:
    """confluent-kafka's SchemaRegistryClient for these settings (it caches schemas by id).
    Its own retries are off: a registry that does not answer fails the build, and the
    pipeline's build retry backs off."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    env = os.environ if env is None else env
    conf: dict[str, Any] = {"url": settings.url, "max.retries": 0, "timeout": 10}
    user_info = env_value(env, USER_INFO_ENV)
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def latest_schema(settings: RegistrySettings, topic: str) -> str:
    """The latest Avro schema of the topic's subject (``schema_from = "registry"``, at apply)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = settings.subject(topic)
    try:
        registered = registry_client(settings).get_latest_version(subject)
    except SchemaRegistryError as exc:
        raise ConfigError(f"schema_from = registry: subject {subject!r} at {settings.url}: {exc}") from exc
    except Exception as exc:  # the client's transport errors are not part of its API
        raise ConfigError(f"schema_from = registry: cannot reach the registry at {settings.url}: {exc}") from exc
    schema = registered.schema
    if schema.schema_type not in (None, "AVRO"):
        raise ConfigError(f"schema_from = registry: subject {subject!r} holds a {schema.schema_type} schema, not Avro")
    return str(schema.schema_str)
