"""A registry's JSON Schema as the spec's columns (``format = "json_schema"`` with
``schema_from = "registry"``); the records are then read as format json reads them.

The root is an object; each property a column (ingest.formats.types), at any depth:

===============================================  ===========================================
``string``                                       string; ``format`` ``date-time``: timestamp,
                                                 ``date``: date; Kafka Connect's ``bytes``
                                                 (``connect.type``): binary (base64 text)
``integer``                                      long; ``connect.type`` int8/16/32: int
``number``                                       double; ``connect.type`` float32: float
``boolean``                                      boolean
``array``                                        array of its ``items``
``object`` with ``properties``                   struct of them
``object`` with ``additionalProperties`` only    map<string, V>
``enum`` / ``const`` of strings                  string
``null``                                         no column
===============================================  ===========================================

A ``type`` list, ``oneOf`` or ``anyOf`` of ``null`` and one other schema is that schema; a
local ``$ref`` (``#/definitions/...``, ``#/$defs/...``) is followed. Anything else (a union of
several types, a recursive ``$ref``, a ``$ref`` to another document) has no column type: the
spec is refused with one line naming the property.
"""

from __future__ import annotations

import json
from typing import Any

from ingest.errors import ConfigError
from ingest.formats.types import Array, ColumnType, Map, Scalar, Struct, canonical

_CONNECT_INTEGERS = {"int8": "int", "int16": "int", "int32": "int", "int64": "long"}
_CONNECT_NUMBERS = {"float32": "float", "float64": "double"}


class _Columns:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.open: list[str] = []

    def refuse(self, path: str, why: str) -> ConfigError:
        return ConfigError(f"schema_from = registry: property {path!r} {why}, which has no column type")

    def column(self, path: str, doc: Any) -> ColumnType | None:
        if doc is True or doc == {}:
            raise self.refuse(path, "accepts any value")
        if not isinstance(doc, dict):
            raise self.refuse(path, f"is {json.dumps(doc)}")
        if "$ref" in doc:
            return self._ref(path, str(doc["$ref"]))
        for key in ("oneOf", "anyOf"):
            if key in doc:
                branches = [b for b in doc[key] if not (isinstance(b, dict) and b.get("type") == "null")]
                if len(branches) != 1:
                    raise self.refuse(path, f"is a {key} of {len(branches)} schemas")
                return self.column(path, branches[0])
        kind = doc.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"]
            if len(kinds) > 1:
                raise self.refuse(path, f"has the types {kinds}")
            if not kinds:
                return None
            kind = kinds[0]
        if kind is None and ("enum" in doc or "const" in doc):
            values = doc.get("enum", [doc.get("const")])
            if all(isinstance(v, str) for v in values):
                return Scalar("string")
            raise self.refuse(path, "is an enum of other than strings")
        if kind == "null":
            return None
        if kind == "string":
            if doc.get("connect.type") == "bytes":
                return Scalar("binary")
            return Scalar({"date-time": "timestamp", "date": "date"}.get(str(doc.get("format")), "string"))
        if kind == "integer":
            return Scalar(_CONNECT_INTEGERS.get(str(doc.get("connect.type")), "long"))
        if kind == "number":
            return Scalar(_CONNECT_NUMBERS.get(str(doc.get("connect.type")), "double"))
        if kind == "boolean":
            return Scalar("boolean")
        if kind == "array":
            inner = self.column(f"{path}[]", doc.get("items", True))
            return None if inner is None else Array(inner)
        if kind == "object" or "properties" in doc:
            return self._object(path, doc)
        raise self.refuse(path, f"has type {json.dumps(kind)}")

    def _object(self, path: str, doc: dict[str, Any]) -> ColumnType | None:
        properties = doc.get("properties")
        extra = doc.get("additionalProperties")
        if not properties and isinstance(extra, dict):
            inner = self.column(f"{path}{{}}", extra)
            return None if inner is None else Map(Scalar("string"), inner)
        fields = []
        for name, sub in (properties or {}).items():
            inner = self.column(f"{path}.{name}" if path else name, sub)
            if inner is not None:
                fields.append((name, inner))
        return Struct(tuple(fields)) if fields else None

    def _ref(self, path: str, ref: str) -> ColumnType | None:
        if not ref.startswith("#/"):
            raise self.refuse(path, f"refers to another document ({ref})")
        if ref in self.open:
            raise self.refuse(path, f"is recursive ({ref})")
        target: Any = self.root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise self.refuse(path, f"refers to {ref}, which the schema does not define")
            target = target[part]
        self.open.append(ref)
        try:
            return self.column(path, target)
        finally:
            self.open.pop()


def json_schema_columns(schema: str) -> tuple[tuple[str, str], ...]:
    """A registry's JSON Schema (an object) as the spec's columns (the module's table)."""
    try:
        doc = json.loads(schema)
    except ValueError as exc:
        raise ConfigError(f"schema_from = registry: the registry's JSON Schema is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("schema_from = registry: the registry's JSON Schema is not an object schema")
    record = _Columns(doc).column("", doc)
    if not isinstance(record, Struct):
        raise ConfigError("schema_from = registry: the registry's JSON Schema has no property with a column type")
    return tuple((name, canonical(ctype)) for name, ctype in record.fields)
