"""Format protobuf in the Confluent wire format, decoded inside the Spark job: the staged rows
go through ``mapInArrow`` to a Python worker, which decodes each value with a message class
built from its writer's FileDescriptorProto (``protobuf``'s upb) and returns Arrow columns
named and typed like the spec's ``[schema]``, plus ``_reason``: why a record is rejected, or
null. spark-protobuf is served at no version; this keeps the decode in the Spark job.

The wire format: magic byte 0, the 4-byte big-endian schema id, the message-index list (a
zigzag varint count, then that many zigzag varint indexes; the count 0 alone means ``[0]``,
the file's first message), then the message. The indexes are a path: the file's n-th
top-level message, then its nested types.

Columns are matched by field name; a nested message's field by the path joined with ``__``
(column ``device__os`` reads ``device.os``). A field the writer does not have gives null, as
does a field with presence (``optional``, a message, a wrapper) that is not set; a proto3
field without presence gives its value (its default when not sent). What a column can hold:
the field's own type or one Avro would promote to it (int32 to long, float and double; int64
and uint32 to long; every integer and float to double), enums as their names, repeated fields
as arrays, ``google.protobuf.Timestamp`` as timestamp, the wrappers
(``google.protobuf.Int64Value`` ...) as their value, bytes as binary, a message as a struct (by
field name, at any depth), a map field as a map. A ``__`` path through a repeated message or a
map names no one value: every record of that writer message is ``unresolvable``.

Every record gets exactly one outcome: columns, or one reason of ``PROTOBUF_REASONS``. A value
no column may hold is its own record's reason, checked as it is read (never when the batch's
Arrow arrays are built, where one value would fail the whole batch, and its build for ever):
an integer into ``double`` past +-2**53 or into ``float`` past +-2**24, where not every integer
is exact (``unresolvable``; no value is rounded), and a ``string`` field whose bytes are not
UTF-8, which a proto2 file does not check (upb then gives ``bytes``;
``invalid_utf8``; a proto3 one is ``undecodable``).

This module runs in Spark's Python workers: it imports only the standard library, pyarrow
and protobuf (and is imported by name, so the workers need the ``ingest`` package).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingest.formats.types import Array, ColumnType, Map, Scalar, Struct, parse_type

#: The reasons this decoder gives (a subset of ingest_common.model.PARSE_ERRORS).
PROTOBUF_REASONS = (
    "null_value",
    "not_confluent_framed",
    "unknown_schema_id",
    "unknown_message_index",
    "undecodable",
    "unresolvable",
    "invalid_utf8",
    "missing_event_time",
)
REASON_COLUMN = "_reason"
# Past this many message indexes a header is taken for garbage (real nesting is shallow).
MAX_INDEXES = 32
_MAX_VARINT_BYTES = 10
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

#: One writer schema, as fetched: its FileDescriptorProtos serialized, dependencies first, the
#: writer's own file last. Empty: the registry's schema could not be read (its records are
#: ``unresolvable``).
ProtoFiles = tuple[bytes, ...]


class BadFraming(ValueError):
    """The value is not in the Confluent Protobuf wire format."""


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos``, and the position after it."""
    raw = shift = 0
    for at in range(pos, min(pos + _MAX_VARINT_BYTES, len(value))):
        byte = value[at]
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), at + 1
        shift += 7
    raise BadFraming("truncated or overlong varint")


def parse_header(value: bytes) -> tuple[int, tuple[int, ...], int]:
    """The schema id, the message indexes and where the message starts, of a framed value."""
    if len(value) < 6 or value[0] != 0:
        raise BadFraming("no magic byte 0, schema id and message indexes")
    sid = int.from_bytes(value[1:5], "big")
    if value[5] == 0:  # the common case: the first message, one byte
        return sid, (0,), 6
    count, pos = _varint(value, 5)
    if not 0 < count <= MAX_INDEXES:
        raise BadFraming(f"message index count {count}")
    indexes = []
    for _ in range(count):
        index, pos = _varint(value, pos)
        indexes.append(index)
    return sid, tuple(indexes), pos


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


class _BadValue(Exception):
    """A value of the message no column may hold: its record is a reject with ``reason``."""

    reason = "unresolvable"


class _Unresolvable(_BadValue):
    """A value the reader column cannot hold."""


class _InvalidUtf8(_BadValue):
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


# -- decoding


@dataclass
class _Message:
    cls: Any
    extractors: list[Extract] | None


@dataclass
class Decoder:
    """Decodes staged batches for one build: its writers (schema id to FileDescriptorProtos)
    and the spec's columns. Message classes are made on first use and kept."""

    writers: Mapping[int, ProtoFiles]
    columns: tuple[tuple[str, str], ...]
    event_time: str
    _messages: dict[tuple[int, tuple[int, ...]], _Message | str] = field(default_factory=dict)
    _files: dict[int, Any] = field(default_factory=dict)

    def message(self, sid: int, indexes: tuple[int, ...]) -> _Message | str:
        """The message class and extractors of a writer message, or the reason its records are
        rejected."""
        key = (sid, indexes)
        found = self._messages.get(key)
        if found is None:
            found = self._messages[key] = self._resolve(sid, indexes)
        return found

    def _resolve(self, sid: int, indexes: tuple[int, ...]) -> _Message | str:
        from google.protobuf import message_factory

        if sid not in self.writers:
            return "unknown_schema_id"
        file = self._file(sid)
        if file is None:
            return "unresolvable"
        types = list(file.message_types_by_name.values())
        desc = None
        for index in indexes:
            if not 0 <= index < len(types):
                return "unknown_message_index"
            desc = types[index]
            types = list(desc.nested_types)
        assert desc is not None  # indexes is never empty
        return _Message(message_factory.GetMessageClass(desc), resolve(desc, self.columns))

    def _file(self, sid: int) -> Any:
        from google.protobuf import descriptor_pb2, descriptor_pool

        if sid not in self._files:
            files = self.writers[sid]
            file = None
            if files:
                # A pool per writer: two versions of one file cannot share a pool.
                pool = descriptor_pool.DescriptorPool()
                for serialized in files:
                    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(serialized))
                file = pool.FindFileByName(descriptor_pb2.FileDescriptorProto.FromString(files[-1]).name)
            self._files[sid] = file
        return self._files[sid]

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's columns, then one column per spec column and ``_reason``."""
        from google.protobuf.message import DecodeError

        n_columns = len(self.columns)
        out: list[list[Any]] = [[] for _ in range(n_columns)]
        reasons: list[str | None] = []
        names = [name for name, _ in self.columns]
        # The Kafka timestamp (no column of the message) is never missing.
        event_at = names.index(self.event_time) if self.event_time in names else None
        nulls = (None,) * n_columns
        for value in batch.column("_value").to_pylist():
            row: Sequence[Any] = nulls
            reason: str | None = None
            if value is None:
                reason = "null_value"
            else:
                try:
                    sid, indexes, start = parse_header(value)
                except BadFraming:
                    reason = "not_confluent_framed"
                else:
                    found = self.message(sid, indexes)
                    if isinstance(found, str):
                        reason = found
                    elif found.extractors is None:
                        reason = "unresolvable"
                    else:
                        try:
                            msg = found.cls.FromString(value[start:])
                        except DecodeError:
                            reason = "undecodable"
                        else:
                            try:
                                row = [extract(msg) for extract in found.extractors]
                            except _BadValue as bad:
                                reason, row = bad.reason, nulls
                            else:
                                if event_at is not None and row[event_at] is None:
                                    reason, row = "missing_event_time", nulls
            reasons.append(reason)
            for column, cell in zip(out, row, strict=True):
                column.append(cell)
        arrays = [
            *batch.columns,
            *(pa.array(values, arrow_type(ctype)) for values, (_, ctype) in zip(out, self.columns, strict=True)),
            pa.array(reasons, pa.string()),
        ]
        names = [*batch.schema.names, *(name for name, _ in self.columns), REASON_COLUMN]
        return pa.RecordBatch.from_arrays(arrays, names=names)


# One decoder per build's writers and columns in each Python worker (Spark reuses its
# workers across tasks): message classes are made once per worker, not once per task.
_DECODERS: dict[tuple[Any, ...], Decoder] = {}
_DECODERS_LOCK = threading.Lock()
_KEEP_DECODERS = 16


@dataclass(frozen=True)
class ArrowDecode:
    """The function ``mapInArrow`` runs (pickled to the workers with its writers)."""

    writers: tuple[tuple[int, ProtoFiles], ...]
    columns: tuple[tuple[str, str], ...]
    event_time: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        key = (self.writers, self.columns, self.event_time)
        with _DECODERS_LOCK:
            decoder = _DECODERS.get(key)
            if decoder is None:
                if len(_DECODERS) >= _KEEP_DECODERS:
                    _DECODERS.clear()
                decoder = _DECODERS[key] = Decoder(dict(self.writers), self.columns, self.event_time)
        for batch in batches:
            yield decoder.decode(batch)
