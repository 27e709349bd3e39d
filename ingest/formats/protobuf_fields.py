"""Protobuf fields into the spec's columns: how one writer message's fields become each column's
values (:func:`resolve`, once per writer message), and the values no column may hold, each its
own record's reason (:class:`BadValue`). Runs in Spark's Python workers with ingest.formats.protobuf.

What a column can hold: the field's own type or one Avro would promote to it (int32 to long,
float and double; int64 and uint32 to long; every integer and float to double), enums as their
names, repeated fields as arrays, ``google.protobuf.Timestamp`` as timestamp, the wrappers
(``google.protobuf.Int64Value`` ...) as their value, bytes as binary, a message as a struct (by
field name, at any depth), a map field as a map. A column names a field by its name, or by a
``__`` path through singular messages; a path through a repeated message or a map names no one
value: every record of that writer message is ``unresolvable``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from ingest.formats.types import Array, ColumnType, Map, Scalar, Struct, parse_type

_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
# The range google.protobuf.Timestamp allows: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799
_INT64_MAX = 2**63 - 1
# Every integer up to these (either sign) is exact in a double and in a float; past them not.
_EXACT_IN = {"double": 2**53, "float": 2**24}


#: The scalar column types a Protobuf field is decoded into; arrays, maps and structs of them
#: hold repeated fields, map fields and messages, at any depth.
PROTOBUF_SCALARS = ("string", "long", "int", "double", "float", "boolean", "binary", "timestamp", "date")
_ARROW_SCALARS = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def protobuf_type_problem(ctype: str) -> str | None:
    """Why a column of this type can hold no Protobuf field (None: it can)."""

    def walk(t: ColumnType) -> str | None:
        if isinstance(t, Scalar):
            return None if t.name in PROTOBUF_SCALARS else t.name
        if isinstance(t, Array):
            return walk(t.element)
        if isinstance(t, Map):
            return walk(t.key) or walk(t.value)
        if isinstance(t, Struct):
            return next((p for p in (walk(f) for _, f in t.fields) if p), None)
        return "decimal"

    return walk(parse_type(ctype))


def arrow_type(ctype: str) -> pa.DataType:
    """The Arrow type Spark reads as the column type of a spec (timestamps in the session's UTC)."""
    return _arrow(parse_type(ctype))


def _arrow(t: ColumnType) -> pa.DataType:
    if isinstance(t, Scalar):
        return _ARROW_SCALARS[t.name]
    if isinstance(t, Array):
        return pa.list_(_arrow(t.element))
    if isinstance(t, Map):
        return pa.map_(_arrow(t.key), _arrow(t.value))
    if isinstance(t, Struct):
        return pa.struct([(name, _arrow(f)) for name, f in t.fields])
    raise ValueError(f"no Protobuf column type {t}")


class BadValue(Exception):
    """A value of the message no column may hold: its record is a reject with ``reason``."""

    reason = "unresolvable"


class _Unresolvable(BadValue):
    """A value the reader column cannot hold."""


class _InvalidUtf8(BadValue):
    """A string field's bytes that are not UTF-8."""

    reason = "invalid_utf8"


# -- resolution: one writer message against the spec's columns

Extract = Callable[[Any], Any]


def _integer_kinds() -> tuple[set[int], set[int], set[int]]:
    """The integer field types: 32-bit signed; the other 64-bit signed and 32-bit unsigned; 64-bit unsigned."""
    from google.protobuf.descriptor import FieldDescriptor as F

    i32 = {F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32}
    i64 = {F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT32, F.TYPE_FIXED32}
    u64 = {F.TYPE_UINT64, F.TYPE_FIXED64}
    return i32, i64, u64


def _scalar_kinds() -> dict[str, set[int]]:
    from google.protobuf.descriptor import FieldDescriptor as F

    i32, i64, u64 = _integer_kinds()
    return {
        "int": i32,
        "long": i32 | i64 | u64,
        "float": i32 | i64 | u64 | {F.TYPE_FLOAT},
        "double": i32 | i64 | u64 | {F.TYPE_FLOAT, F.TYPE_DOUBLE},
        "boolean": {F.TYPE_BOOL},
        "string": {F.TYPE_STRING, F.TYPE_ENUM},
    }


def _convert(fd: Any, ctype: str) -> Extract | None:
    """How one (non-repeated) value of field ``fd`` becomes a value of column type ``ctype``;
    None when the column cannot hold the field's type."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if fd.type == F.TYPE_MESSAGE:
        name = fd.message_type.full_name
        if name == _TIMESTAMP and ctype == "timestamp":
            return _timestamp_micros
        if name in _WRAPPERS:
            inner = _convert(fd.message_type.fields_by_name["value"], ctype)
            return None if inner is None else (lambda msg: inner(msg.value))
        return None
    if fd.type not in _scalar_kinds().get(ctype, ()):
        return None
    if fd.type == F.TYPE_ENUM:
        names = {v.number: v.name for v in fd.enum_type.values}

        def enum_name(number: int) -> str:
            name = names.get(number)
            if name is None:  # a number the writer's own enum does not define
                raise _Unresolvable(number)
            return str(name)

        return enum_name
    if fd.type in (F.TYPE_UINT64, F.TYPE_FIXED64) and ctype == "long":

        def in_long(value: int) -> int:
            if value > _INT64_MAX:
                raise _Unresolvable(value)
            return value

        return in_long
    if ctype in _EXACT_IN:
        i32, i64, u64 = _integer_kinds()
        # An int32 is exact in a double; any wider integer is checked, as is any into a float.
        if fd.type in (i64 | u64 if ctype == "double" else i32 | i64 | u64):
            return _exact_integer(_EXACT_IN[ctype])
    if fd.type == F.TYPE_STRING:
        return _utf8
    return _same


def _same(value: Any) -> Any:
    return value


def _exact_integer(limit: int) -> Extract:
    """An integer into a floating-point column: only within +-``limit``, where it is exact
    (pyarrow, building the column, refuses any other, and would fail the whole batch)."""

    def exact(value: int) -> int:
        if not -limit <= value <= limit:
            raise _Unresolvable(value)
        return value

    return exact


def _utf8(value: str | bytes) -> str:
    # upb gives bytes, not str, for a string field whose bytes are not UTF-8 (a proto2 file
    # does not check them when parsing; a proto3 one does: DecodeError).
    if isinstance(value, bytes):
        raise _InvalidUtf8(value)
    return value


def _timestamp_micros(ts: Any) -> int:
    if not (_MIN_SECONDS <= ts.seconds <= _MAX_SECONDS and 0 <= ts.nanos <= 999_999_999):
        raise _Unresolvable(ts)
    return int(ts.seconds * 1_000_000 + ts.nanos // 1000)


class _Through:
    """A ``__`` path that goes through a field no path may cross (a repeated message, a map, a
    scalar): every record of the writer message is ``unresolvable``, never a null column."""


_THROUGH = _Through()


def _field_path(desc: Any, column: str) -> list[Any] | _Through | None:
    """The fields a column names: its own name at the top level, else a ``__`` path through
    singular messages. None: the writer has no such field."""
    if column in desc.fields_by_name:
        return [desc.fields_by_name[column]]
    path = []
    for part in column.split("__"):
        if desc is None:
            return _THROUGH
        if part not in desc.fields_by_name:
            return None
        fd = desc.fields_by_name[part]
        path.append(fd)
        desc = fd.message_type if _is_plain_message(fd) else None
    return path


def _is_plain_message(fd: Any) -> bool:
    from google.protobuf.descriptor import FieldDescriptor as F

    return (
        fd.type == F.TYPE_MESSAGE
        and not _is_repeated(fd)
        and fd.message_type.full_name != _TIMESTAMP
        and fd.message_type.full_name not in _WRAPPERS
    )


def _is_repeated(fd: Any) -> bool:
    return bool(fd.is_repeated)


def _null(_msg: Any) -> None:
    return None


def resolve(desc: Any, ctype_of: Sequence[tuple[str, str]]) -> list[Extract] | None:
    """One extractor per column for messages of ``desc``, or None when a column names a field
    its type cannot hold (then every record of this writer message is ``unresolvable``)."""
    extractors: list[Extract] = []
    for column, ctype in ctype_of:
        path = _field_path(desc, column)
        if path is None:
            extractors.append(_null)
            continue
        if isinstance(path, _Through):
            return None
        *parents, last = path
        read = _field(last, parse_type(ctype))
        if read is None:
            return None
        extractors.append(_within(tuple(p.name for p in parents), read))
    return extractors


def _is_map(fd: Any) -> bool:
    return bool(_is_repeated(fd) and fd.message_type is not None and fd.message_type.GetOptions().map_entry)


def _field(fd: Any, ctype: ColumnType) -> Extract | None:
    """How field ``fd`` of a message becomes a value of ``ctype``, read from the message: a
    map field as a map, a repeated field as an array, a message as a struct (by field name, at
    any depth), a field with presence that is not set as null. None: the column cannot hold it."""
    name = fd.name
    if _is_map(fd):
        if not isinstance(ctype, Map):
            return None
        entry = fd.message_type.fields_by_name
        key, value = _value(entry["key"], ctype.key), _value(entry["value"], ctype.value)
        if key is None or value is None:
            return None
        return lambda msg: [(key(k), value(v)) for k, v in getattr(msg, name).items()]
    if _is_repeated(fd):
        if not isinstance(ctype, Array):
            return None
        each = _value(fd, ctype.element)
        if each is None:
            return None
        return lambda msg: [each(v) for v in getattr(msg, name)]
    convert = _value(fd, ctype)
    if convert is None:
        return None
    if not fd.has_presence:
        return lambda msg: convert(getattr(msg, name))
    return lambda msg: convert(getattr(msg, name)) if msg.HasField(name) else None


def _value(fd: Any, ctype: ColumnType) -> Extract | None:
    """How one value of field ``fd`` (a scalar, or a message) becomes a value of ``ctype``."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if isinstance(ctype, Struct):
        return _struct(fd.message_type, ctype) if _is_plain_message(fd) or _is_message_element(fd) else None
    if ctype == Scalar("binary"):
        return _same if fd.type == F.TYPE_BYTES else None
    if isinstance(ctype, Scalar):
        return _convert(fd, ctype.name)
    return None


def _is_message_element(fd: Any) -> bool:
    """A repeated message field's element, or a map's message value: a message of its own."""
    from google.protobuf.descriptor import FieldDescriptor as F

    return fd.type == F.TYPE_MESSAGE and fd.message_type.full_name not in (_TIMESTAMP, *_WRAPPERS)


def _struct(desc: Any, ctype: Struct) -> Extract | None:
    """A message as a struct: each struct field read from the message's field of that name
    (null when the writer has none)."""
    parts: list[tuple[str, Extract]] = []
    for name, inner in ctype.fields:
        fd = desc.fields_by_name.get(name)
        read = _null if fd is None else _field(fd, inner)
        if read is None:
            return None
        parts.append((name, read))
    return lambda msg: {name: read(msg) for name, read in parts}


def _within(steps: tuple[str, ...], read: Extract) -> Extract:
    """``read`` applied to the message at the end of a ``__`` path (null when a step is not set)."""
    if not steps:
        return read

    def get(msg: Any) -> Any:
        for step in steps:
            if not msg.HasField(step):
                return None
            msg = getattr(msg, step)
        return read(msg)

    return get
