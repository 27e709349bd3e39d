"""Avro schemas of a spec: the reader schema of its ``[schema]`` columns, the reader schema one
writer's records are resolved to, and a registry's record schema as the spec's columns.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ingest.errors import ConfigError


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
