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
as arrays, ``google.protobuf.Timestamp`` as timestamp and the wrappers
(``google.protobuf.Int64Value`` ...) as their value.

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


#: The column types a Protobuf field is decoded into (and arrays of them).
PROTOBUF_SCALARS = ("string", "long", "int", "double", "float", "boolean", "timestamp", "date")


def arrow_type(ctype: str) -> pa.DataType:
    """The Arrow type Spark reads as the column type of a spec (timestamps in the session's UTC)."""
    if ctype.startswith("array<"):
        return pa.list_(arrow_type(ctype[6:-1]))
    return {
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "float": pa.float32(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
    }[ctype]


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


def _field_path(desc: Any, column: str) -> list[Any] | None:
    """The fields a column names: its own name at the top level, else a ``__`` path through
    singular messages. None: the writer has no such field."""
    if column in desc.fields_by_name:
        return [desc.fields_by_name[column]]
    path = []
    for part in column.split("__"):
        if desc is None or part not in desc.fields_by_name:
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
        *parents, last = path
        if ctype.startswith("array<"):
            # A map is a repeated message (its entries): no column type holds it.
            each = _convert(last, ctype[6:-1])
            if each is None or not _is_repeated(last):
                return None
            extractors.append(_getter(parents, last.name, False, _each(each)))
        else:
            convert = _convert(last, ctype)
            if convert is None or _is_repeated(last):
                return None
            extractors.append(_getter(parents, last.name, bool(last.has_presence), convert))
    return extractors


def _each(convert: Extract) -> Extract:
    return lambda values: [convert(v) for v in values]


def _getter(parents: Sequence[Any], name: str, presence: bool, convert: Extract) -> Extract:
    steps = tuple(p.name for p in parents)
    if not steps and not presence:
        return lambda msg: convert(getattr(msg, name))

    def get(msg: Any) -> Any:
        for step in steps:
            if not msg.HasField(step):
                return None
            msg = getattr(msg, step)
        if presence and not msg.HasField(name):
            return None
        return convert(getattr(msg, name))

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
