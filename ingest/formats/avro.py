"""Avro schemas of a spec: the reader schema of its ``[schema]`` columns, the reader schema one
writer's records are resolved to, and a registry's record schema as the spec's columns.

Spark's ``from_avro`` gives each Avro type the Spark type its ``SchemaConverters`` names, and
:func:`avro_columns` names the same one in the column types of ingest.formats.types (checked
against Spark itself by tests/integration/test_avro_types.py): record -> struct (any depth),
array -> array, map -> map<string,V>, enum -> string, fixed and bytes -> binary, decimal (bytes
or fixed) -> decimal(p,s), string (uuid too) -> string, timestamp-millis/micros -> timestamp,
local-timestamp-millis/micros -> timestamp_ntz, date -> date, time-millis -> int and
time-micros -> long (Spark reads them as numbers), a union of null and one type -> that type,
int|long -> long, float|double -> double, any other union -> struct<member0:...,member1:...>
(one field per non-null branch, the one written set), null -> no column. A recursive record
has no column type (neither Spark nor Iceberg holds one): such a schema is refused.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ingest.errors import ConfigError
from ingest.formats.avro_resolution import full_name as _full_name
from ingest.formats.types import Array, ColumnType, Decimal, Map, Scalar, Struct, canonical, parse_type

#: A field every reader schema gets, which no writer has: its default (true) is filled in for
#: every record that decodes. Spark's from_avro in PERMISSIVE mode gives a row of nulls for a
#: body that does not decode, which this field tells apart from a record of null fields.
#: Spec columns cannot start with "_", so it clashes with none.
DECODED_FIELD = "_ingest_decoded"
_READER_NAME = "ingest_record"
_NAMED = ("record", "error", "enum", "fixed")
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_TIMESTAMPS = {
    "timestamp-millis": ("utc", "millis"),
    "timestamp-micros": ("utc", "micros"),
    "local-timestamp-millis": ("local", "millis"),
    "local-timestamp-micros": ("local", "micros"),
}


# -- a spec's columns as a reader schema --------------------------------------------------


def _reader_type(ctype: ColumnType, path: str) -> Any:
    """The Avro type a column type is read as (not nullable; :func:`_nullable` wraps it)."""
    if isinstance(ctype, Scalar):
        return {
            "binary": "bytes",
            "date": {"type": "int", "logicalType": "date"},
            "timestamp": {"type": "long", "logicalType": "timestamp-millis"},
            "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-millis"},
        }.get(ctype.name, ctype.name)
    if isinstance(ctype, Decimal):
        return {"type": "bytes", "logicalType": "decimal", "precision": ctype.precision, "scale": ctype.scale}
    if isinstance(ctype, Array):
        return {"type": "array", "items": _nullable(_reader_type(ctype.element, f"{path}_item"))}
    if isinstance(ctype, Map):
        if ctype.key != Scalar("string"):
            raise ConfigError(f"column type {canonical(ctype)}: Avro maps have string keys only")
        return {"type": "map", "values": _nullable(_reader_type(ctype.value, f"{path}_value"))}
    return _reader_record(f"{_READER_NAME}_{path}", tuple((n, _reader_type(t, f"{path}_{n}")) for n, t in ctype.fields))


def _nullable(avro: Any) -> Any:
    return ["null", avro]


def _reader_record(name: str, fields: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "fields": [{"name": n, "type": _nullable(t), "default": None} for n, t in fields],
    }


def avro_reader_schema(columns: tuple[tuple[str, str], ...]) -> str:
    """The Avro reader schema of a spec's ``[schema]``: every field nullable at every depth,
    null by default (a writer without the field gives null). Timestamps are read as *-millis
    until a writer says micros, enums and fixed as the writer has them (:func:`decode_schemas`)."""
    doc = _reader_record(_READER_NAME, tuple((n, _reader_type(parse_type(t), n)) for n, t in columns))
    return json.dumps(doc, separators=(",", ":"))


# -- one writer's reader --------------------------------------------------------------------


class _Names:
    """The named types of one schema, by full name, and a lookup of references."""

    def __init__(self, doc: Any) -> None:
        self.by_name: dict[str, tuple[dict[str, Any], str]] = {}
        self._collect(doc, "")

    def _collect(self, doc: Any, namespace: str) -> None:
        if isinstance(doc, list):
            for branch in doc:
                self._collect(branch, namespace)
        elif isinstance(doc, dict):
            kind = doc.get("type")
            if kind in _NAMED:
                full, inner = _full_name(doc, namespace)
                self.by_name[full] = (doc, inner)
                for field in doc.get("fields", []) if kind in ("record", "error") else []:
                    self._collect(field["type"], inner)
            elif kind == "array":
                self._collect(doc["items"], namespace)
            elif kind == "map":
                self._collect(doc["values"], namespace)
            elif isinstance(kind, dict | list):
                self._collect(kind, namespace)

    def deref(self, doc: Any, namespace: str) -> tuple[Any, str, str | None]:
        """``doc`` with a name reference replaced by its definition, ``{"type": X}`` by X when X
        is not a primitive with attributes; the namespace its children inherit; its full name
        (named types only)."""
        while isinstance(doc, dict) and isinstance(doc.get("type"), dict | list):
            doc = doc["type"]
        if isinstance(doc, str) and doc not in _PRIMITIVES:
            full = doc if "." in doc or not namespace else f"{namespace}.{doc}"
            found = self.by_name.get(full) or self.by_name.get(doc)
            if found is None:
                raise ConfigError(f"Avro schema: unknown type name {doc!r}")
            doc, namespace = found
        if isinstance(doc, dict) and doc.get("type") in _NAMED:
            full, inner = _full_name(doc, namespace)
            return doc, inner, full
        return doc, namespace, None


def _kind(doc: Any) -> str:
    """The Avro type name of a dereferenced type ("union" for a list)."""
    if isinstance(doc, list):
        return "union"
    return str(doc["type"] if isinstance(doc, dict) else doc)


def _is_null(doc: Any) -> bool:
    return (
        doc == "null"
        or (isinstance(doc, dict) and doc.get("type") == "null")
        or (isinstance(doc, list) and all(_is_null(b) for b in doc))
    )


def _inline(doc: Any, names: _Names, namespace: str, path: str, open_: dict[str, str]) -> Any:
    """The writer schema with every named type written out where it is used, under a name of
    its path (``ingest.w.<path>``): the binary encoding is the same (names are not encoded),
    and each use can then be read as a reader of its own. A record inside itself (recursion)
    stays a reference to its enclosing copy."""
    doc, inner, full = names.deref(doc, namespace)
    if isinstance(doc, list):
        return [_inline(b, names, inner, f"{path}_u{i}", open_) for i, b in enumerate(doc)]
    if not isinstance(doc, dict):
        return doc
    kind = doc.get("type")
    if full is not None:
        if full in open_:
            return open_[full]
        name = f"ingest.w.{path}"
        copied = {**{k: v for k, v in doc.items() if k not in ("namespace", "aliases")}, "name": name}
        if kind in ("record", "error"):
            open_[full] = name
            try:
                copied["fields"] = [
                    {**f, "type": _inline(f["type"], names, inner, f"{path}_{f['name']}", open_)}
                    for f in doc.get("fields", [])
                ]
            finally:
                del open_[full]
        return copied
    if kind == "array":
        return {**doc, "items": _inline(doc["items"], names, inner, f"{path}_i", open_)}
    if kind == "map":
        return {**doc, "values": _inline(doc["values"], names, inner, f"{path}_v", open_)}
    return doc


class _Adapter:
    """Makes a reader schema read one (inlined) writer's records as the reader means them:
    Avro's resolution matches named types by name and ignores logical types, so each named
    type of the reader takes the name of the writer's at the same place (its own path's when
    the writer has none there), the writer's enum and fixed where it reads a string or bytes,
    and the writer's unit for its timestamps (a micros writer read by a millis reader would be
    1000 times off). Fields of type null are left out (Spark has no column for them)."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self.rnames, self.wnames = _Names(reader), _Names(writer)

    def adapt(self, r: Any, rspace: str, w: Any, path: str) -> Any:
        r, rspace, _ = self.rnames.deref(r, rspace)
        w = self.wnames.deref(w, "")[0] if w is not None else None
        if isinstance(r, list):
            branches = [b for b in r if not _is_null(b)]
            if len(branches) == 1:
                return (["null"] if len(branches) < len(r) else []) + [
                    self.adapt(branches[0], rspace, _single_branch(w), path)
                ]
            # A union of several: matched branch by branch by Avro (names kept from the writer's union).
            wbranches = [self.wnames.deref(b, "")[0] for b in w] if isinstance(w, list) else []
            return [self._branch(b, rspace, wbranches, f"{path}_u{i}") for i, b in enumerate(r)]
        w = _single_branch(w)
        if w is not None:
            w = self.wnames.deref(w, "")[0]
        rkind, wkind = _kind(r), (_kind(w) if w is not None else None)
        name = str(w["name"]) if isinstance(w, dict) and wkind == rkind and "name" in w else f"ingest.r.{path}"
        if rkind in ("record", "error"):
            written = {f["name"]: f for f in (w.get("fields", []) if wkind in ("record", "error") else [])}
            fields = []
            for field in r.get("fields", []):
                if _is_null(self.rnames.deref(field["type"], rspace)[0]):
                    continue
                source = written.get(field["name"]) or next(
                    (written[a] for a in field.get("aliases", []) if a in written), None
                )
                wtype = None if source is None else source["type"]
                fields.append({**field, "type": self.adapt(field["type"], rspace, wtype, f"{path}_{field['name']}")})
            return {**_unnamed(r), "name": name, "fields": fields}
        if rkind == "array":
            return {**r, "items": self.adapt(r["items"], rspace, w["items"] if wkind == "array" else None, f"{path}_i")}
        if rkind == "map":
            return {
                **r,
                "values": self.adapt(r["values"], rspace, w["values"] if wkind == "map" else None, f"{path}_v"),
            }
        if rkind in ("enum", "fixed"):
            return {**_unnamed(r), "name": name}
        logical = r.get("logicalType") if isinstance(r, dict) else None
        wlogical = w.get("logicalType") if isinstance(w, dict) else None
        if logical in _TIMESTAMPS and wlogical in _TIMESTAMPS:
            zone = _TIMESTAMPS[logical][0]
            unit = _TIMESTAMPS[wlogical][1]
            return {**r, "logicalType": ("timestamp-" if zone == "utc" else "local-timestamp-") + unit}
        if rkind == "string" and wkind == "enum" and not logical:
            return w
        if rkind == "bytes" and wkind == "fixed" and logical == wlogical and _same_decimal(r, w):
            return w
        return r

    def _branch(self, r: Any, rspace: str, wbranches: list[Any], path: str) -> Any:
        """One branch of a reader union of several: read as the writer branch of its kind (and,
        for named types, its name)."""
        kind = _kind(self.rnames.deref(r, rspace)[0])
        rname = self.rnames.deref(r, rspace)[2]
        short = rname.rpartition(".")[2] if rname else None
        for w in wbranches:
            if _kind(w) == kind and (
                short is None or str(w.get("name", "")).endswith(f".{short}") or w.get("name") == short
            ):
                return self.adapt(r, rspace, w, path)
        same_kind = [w for w in wbranches if _kind(w) == kind]
        return self.adapt(r, rspace, same_kind[0] if len(same_kind) == 1 else None, path)


def _unnamed(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("namespace", "aliases")}


def _single_branch(w: Any) -> Any:
    """The writer's one non-null branch of a union (or the type itself; None for a union of several)."""
    if not isinstance(w, list):
        return w
    branches = [b for b in w if not _is_null(b)]
    return branches[0] if len(branches) == 1 else None


def _same_decimal(r: Any, w: Any) -> bool:
    return (
        not isinstance(r, dict)
        or r.get("logicalType") != "decimal"
        or (r.get("precision"), r.get("scale", 0)) == (w.get("precision"), w.get("scale", 0))
    )


def decode_schemas(reader: str, writer: str) -> tuple[str, str]:
    """The writer and reader schemas one writer's records are decoded with: the writer with
    its named types inlined (:func:`_inline`, the same encoding) and the reader adapted to it
    (:class:`_Adapter`), :data:`DECODED_FIELD` added to the reader's record."""
    rdoc, wdoc = json.loads(reader), json.loads(writer)
    inlined = _inline(wdoc, _Names(wdoc), "", "v", {})
    top = inlined if isinstance(inlined, dict) and inlined.get("type") == "record" else None
    doc = copy.deepcopy(_Adapter(rdoc, inlined).adapt(rdoc, "", top, "v"))
    doc["fields"] = [*doc["fields"], {"name": DECODED_FIELD, "type": "boolean", "default": True}]
    return json.dumps(inlined, separators=(",", ":")), json.dumps(doc, separators=(",", ":"))


# -- a registry's record schema as columns --------------------------------------------------


class _Columns:
    def __init__(self, doc: Any) -> None:
        self.names = _Names(doc)
        self.open: list[str] = []

    def column(self, field: str, doc: Any, namespace: str) -> ColumnType | None:
        """The column type Spark's from_avro gives ``doc`` (None: no column, type null)."""
        doc, namespace, full = self.names.deref(doc, namespace)
        kind = _kind(doc)
        if kind == "union":
            return self._union(field, doc, namespace)
        if kind == "null":
            return None
        if kind in ("record", "error"):
            return self._record(field, doc, namespace, full or "")
        if kind == "array":
            inner = self.column(f"{field}[]", doc["items"], namespace)
            return None if inner is None else Array(inner)
        if kind == "map":
            inner = self.column(f"{field}{{}}", doc["values"], namespace)
            return None if inner is None else Map(Scalar("string"), inner)
        logical = doc.get("logicalType") if isinstance(doc, dict) else None
        if kind in ("bytes", "fixed") and logical == "decimal":
            precision, scale = doc.get("precision"), doc.get("scale", 0)
            if not (isinstance(precision, int) and isinstance(scale, int) and 0 <= scale <= precision <= 38):
                raise ConfigError(
                    f"schema_from = registry: field {field!r} is decimal({precision},{scale}), which has no column "
                    "type (Spark and Iceberg hold a precision of 1 to 38 and a scale of 0 to the precision)"
                )
            return Decimal(precision, scale)
        if kind in ("bytes", "fixed"):
            return Scalar("binary")
        if kind in ("string", "enum"):
            return Scalar("string")
        if kind == "int":
            return Scalar("date" if logical == "date" else "int")
        if kind == "long":
            zone = _TIMESTAMPS.get(str(logical), ("", ""))[0]
            return Scalar({"utc": "timestamp", "local": "timestamp_ntz"}.get(zone, "long"))
        if kind in ("boolean", "float", "double"):
            return Scalar(kind)
        raise ConfigError(f"schema_from = registry: field {field!r} has Avro type {json.dumps(doc)}, which is not Avro")

    def _union(self, field: str, doc: list[Any], namespace: str) -> ColumnType | None:
        branches = [self.names.deref(b, namespace)[0] for b in doc]
        branches = [b for b in branches if not _is_null(b)]
        if not branches:
            return None
        kinds = {_kind(b) for b in branches}
        if len(branches) == 1:
            return self.column(field, branches[0], namespace)
        if kinds <= {"int", "long"}:
            return Scalar("long")
        if kinds <= {"float", "double"}:
            return Scalar("double")
        members: list[tuple[str, ColumnType]] = []
        for i, branch in enumerate(branches):
            inner = self.column(f"{field}.member{i}", branch, namespace)
            if inner is not None:
                members.append((f"member{i}", inner))
        return Struct(tuple(members))

    def _record(self, field: str, doc: dict[str, Any], namespace: str, full: str) -> ColumnType | None:
        if full in self.open:
            raise ConfigError(
                f"schema_from = registry: field {field!r} is the recursive record {full} "
                "(a record holding itself), which no Spark or Iceberg column type holds"
            )
        self.open.append(full)
        try:
            fields = []
            for f in doc.get("fields", []):
                inner = self.column(f"{field}.{f['name']}" if field else str(f["name"]), f["type"], namespace)
                if inner is not None:
                    fields.append((str(f["name"]), inner))
        finally:
            self.open.pop()
        return Struct(tuple(fields)) if fields else None


def avro_columns(schema: str) -> tuple[tuple[str, str], ...]:
    """A registry's Avro record schema as the spec's columns (the module's table); fields of
    type null have none."""
    doc = json.loads(schema)
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise ConfigError("schema_from = registry: the registry's schema is not an Avro record")
    record = _Columns(doc).column("", doc, "")
    if not isinstance(record, Struct):
        raise ConfigError("schema_from = registry: the registry's record has no field with a column type")
    return tuple((name, canonical(ctype)) for name, ctype in record.fields)
