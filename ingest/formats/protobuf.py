"""Format protobuf in the Confluent wire format, decoded inside the Spark job: the staged rows
go through ``mapInArrow`` to a Python worker, which decodes each value with a message class
built from its writer's FileDescriptorProto (``protobuf``'s upb) and returns Arrow columns
named and typed like the spec's ``[schema]``, plus ``_reason``: why a record is rejected, or
null. spark-protobuf is served at no version; this keeps the decode in the Spark job.

The wire format: magic byte 0, the 4-byte big-endian schema id, the message-index list (a
zigzag varint count, then that many zigzag varint indexes; the count 0 alone means ``[0]``,
the file's first message), then the message. The indexes are a path: the file's n-th
top-level message, then its nested types.

Columns are matched by field name, as ingest.formats.protobuf_fields says (what a column can
hold, nested messages, maps, repeated fields).

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingest.formats.protobuf_fields import BadValue, Extract, arrow_type, resolve

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
                            except BadValue as bad:
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
