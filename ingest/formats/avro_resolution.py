"""Avro schema resolution, checked before any record is decoded: can data written with one
schema be read with another, by the rules of the Avro specification ("Schema Resolution")?

The builder asks it once per (reader, writer id), so that the records of a writer its reader
cannot resolve are rejects (``unresolvable_writer_schema``) instead of a Spark job that fails or
decodes nothing; ``source apply`` asks it whether a new reader schema still reads what the
previous one described (:mod:`ingest.spec.evolution`).

The rules, reader R and writer W:

- a writer union resolves when every one of its branches does (a branch that does not would
  fail the records written with it, so the writer as a whole is refused, as Java's
  ``SchemaCompatibility`` does); a reader union when one of its branches resolves W;
- primitives: the same type, or a promotion: int to long, float or double; long to float or
  double; float to double; string to bytes and back;
- records: the same unqualified name; every reader field present in the writer (by name or
  one of the reader field's aliases) resolves, and every reader field the writer lacks has a
  default; writer fields the reader lacks are ignored;
- enums: the same unqualified name, and every writer symbol in the reader's or a reader
  default; fixed: the same unqualified name and size; arrays and maps: their items or values.

Logical types are not part of resolution (Avro reads their underlying types).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = ("record", "error", "enum", "fixed")


class _Unresolvable(Exception):
    """Internal: unwinds the check to its first problem; never leaves this module."""


def resolution_problem(writer: str, reader: str) -> str | None:
    """Why data written with ``writer`` cannot be read with ``reader`` (both Avro schemas as
    JSON text), in one line, or None when it can."""
    try:
        wdoc, rdoc = json.loads(writer), json.loads(reader)
    except ValueError as exc:
        return f"not an Avro schema: {exc}"
    try:
        _Resolver(_names(wdoc), _names(rdoc)).check(wdoc, rdoc, "")
    except _Unresolvable as exc:
        return str(exc)
    except (KeyError, TypeError, AttributeError) as exc:
        return f"not a valid Avro schema ({type(exc).__name__}: {exc})"
    return None


def full_name(doc: dict[str, Any], namespace: str) -> tuple[str, str]:
    """A named type's full name and the namespace its own children inherit."""
    name = str(doc["name"])
    if "." in name:
        return name, name.rpartition(".")[0]
    space = str(doc.get("namespace", namespace) or "")
    return (f"{space}.{name}" if space else name), space


def _names(doc: Any, namespace: str = "", into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every named type a schema defines, by full name (references are resolved through it)."""
    names: dict[str, Any] = {} if into is None else into
    if isinstance(doc, list):
        for branch in doc:
            _names(branch, namespace, names)
    elif isinstance(doc, dict):
        kind = doc.get("type")
        if kind in _NAMED:
            full, namespace = full_name(doc, namespace)
            names[full] = {**doc, "_namespace": namespace}
            for field in doc.get("fields", []) if kind in ("record", "error") else []:
                _names(field["type"], namespace, names)
        elif kind == "array":
            _names(doc["items"], namespace, names)
        elif kind == "map":
            _names(doc["values"], namespace, names)
        elif isinstance(kind, dict | list):
            _names(kind, namespace, names)
    return names


def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _at(where: str) -> str:
    """Where in the record a problem is: a field's path (``a.b``, ``[]`` an array's items,
    ``{}`` a map's values)."""
    return f"field {where!r}" if where else "the record"


def _describe(doc: Any) -> str:
    if isinstance(doc, dict):
        kind = doc.get("type")
        if kind in _NAMED:
            return f"{kind} {doc.get('name')}"
        if kind == "array":
            return f"array<{_describe(doc['items'])}>"
        if kind == "map":
            return f"map<{_describe(doc['values'])}>"
        return _describe(kind)
    if isinstance(doc, list):
        return "union[" + ", ".join(_describe(b) for b in doc) + "]"
    return str(doc)


class _Resolver:
    def __init__(self, writer_names: dict[str, Any], reader_names: dict[str, Any]) -> None:
        self._names = (writer_names, reader_names)
        # Record pairs being checked: a recursive record resolves when nothing else fails.
        self._active: set[tuple[str, str]] = set()

    def _deref(self, doc: Any, side: int) -> Any:
        """A type with a named reference replaced by its definition and a primitive's
        ``{"type": "long", ...}`` by ``"long"`` (logical types ride on their base type)."""
        while isinstance(doc, dict) and not isinstance(doc.get("type"), str):
            doc = doc["type"]
        if isinstance(doc, dict) and doc["type"] not in (*_NAMED, "array", "map"):
            doc = doc["type"]
        if isinstance(doc, str) and doc not in _PRIMITIVES:
            names = self._names[side]
            found = names.get(doc) or next((v for k, v in names.items() if _short(k) == doc), None)
            if found is None:
                raise _Unresolvable(f"unknown type name {doc!r}")
            return found
        return doc

    def check(self, writer: Any, reader: Any, where: str) -> None:
        w, r = self._deref(writer, 0), self._deref(reader, 1)
        if isinstance(w, list):
            for branch in w:
                self.check(branch, r, where)
            return
        if isinstance(r, list):
            problems = list(self._branch_problems(w, r, where))
            if len(problems) == len(r):
                raise _Unresolvable(
                    f"{_at(where)}: the writer's {_describe(w)} matches no branch of the reader's {_describe(r)}"
                )
            return
        if isinstance(w, str) or isinstance(r, str):
            if w == r or (isinstance(w, str) and isinstance(r, str) and r in _PROMOTIONS.get(w, ())):
                return
            raise self._mismatch(w, r, where)
        kind = w.get("type")
        if kind != r.get("type") and {kind, r.get("type")} != {"record", "error"}:
            raise self._mismatch(w, r, where)
        if kind in ("record", "error"):
            self._record(w, r, where)
        elif kind == "enum":
            self._same_name(w, r, where)
            missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
            if missing and "default" not in r:
                raise _Unresolvable(f"{_at(where)}: the reader's enum lacks the symbol(s) {', '.join(missing)}")
        elif kind == "fixed":
            self._same_name(w, r, where)
            if w.get("size") != r.get("size"):
                raise _Unresolvable(f"{_at(where)}: size {w.get('size')} cannot be read as {r.get('size')}")
        elif kind == "array":
            self.check(w["items"], r["items"], f"{where}[]")
        elif kind == "map":
            self.check(w["values"], r["values"], f"{where}{{}}")

    def _branch_problems(self, w: Any, branches: list[Any], where: str) -> Iterator[str]:
        for branch in branches:
            try:
                self.check(w, branch, where)
            except _Unresolvable as exc:
                yield str(exc)
            else:
                return

    @staticmethod
    def _mismatch(w: Any, r: Any, where: str) -> _Unresolvable:
        return _Unresolvable(f"{_at(where)}: the writer's {_describe(w)} cannot be read as {_describe(r)}")

    @staticmethod
    def _same_name(w: dict[str, Any], r: dict[str, Any], where: str) -> None:
        wname, rname = _short(str(w.get("name"))), _short(str(r.get("name")))
        if wname != rname and wname not in map(_short, r.get("aliases", [])):
            raise _Unresolvable(f"{_at(where)}: named {wname} by the writer, {rname} by the reader")

    def _record(self, w: dict[str, Any], r: dict[str, Any], where: str) -> None:
        self._same_name(w, r, where)
        pair = (str(w.get("name")), str(r.get("name")))
        if pair in self._active:
            return
        self._active.add(pair)
        try:
            written = {f["name"]: f for f in w.get("fields", [])}
            for field in r.get("fields", []):
                path = f"{where}.{field['name']}" if where else str(field["name"])
                source = written.get(field["name"]) or next(
                    (written[a] for a in field.get("aliases", []) if a in written), None
                )
                if source is None:
                    if "default" not in field:
                        raise _Unresolvable(f"{_at(path)}: the reader's field has no default and the writer lacks it")
                    continue
                self.check(source["type"], field["type"], path)
        finally:
            self._active.discard(pair)
