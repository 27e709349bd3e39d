"""A Protobuf writer schema from the registry, as the decoder needs it: the schema id's
FileDescriptorProto and those of every file it imports, serialized, dependencies first
(:data:`ingest.formats.protobuf.ProtoFiles`).

Registries differ in what ``GET /schemas/ids/{id}`` returns for Protobuf: Confluent's gives
``.proto`` text and the base64 FileDescriptorProto only with ``?format=serialized``; Apicurio
gives back what was registered (confluent-kafka's Python serializer registers the base64
FileDescriptorProto) and answers ``?format=serialized`` with a 500 for it (it parses the
base64 as ``.proto`` text). So the plain answer is read first and the serialized form asked
only when the plain one is not a base64 FileDescriptorProto. A schema neither gives (Apicurio
holding ``.proto`` text: its serialized form is not base64 and loses bytes) cannot be read
here: :func:`schema_files` returns ``()`` and its records are ``unresolvable``.

Imports are resolved through the schema's ``references`` (subject and version, asked the same
way); the well-known types (``google/protobuf/*.proto``) come from the protobuf package.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import structlog

from ingest.formats.protobuf import ProtoFiles

log = structlog.get_logger(__name__)

_NOT_FOUND = 404


def _well_known() -> dict[str, bytes]:
    """The protobuf package's well-known files by import name."""
    from google.protobuf import (
        any_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )

    modules = [any_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2, field_mask_pb2, source_context_pb2]
    modules += [struct_pb2, timestamp_pb2, type_pb2, wrappers_pb2]
    return {m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb for m in modules}


def _from_base64(text: object) -> Any:
    """A FileDescriptorProto from base64 text, or None when the text is not one."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    if not isinstance(text, str) or not text:
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None


class Unreadable(Exception):
    """A writer schema this decoder cannot read (why: its message)."""


class ReferenceNotFound(Exception):
    """A Protobuf import's subject version answered 404: not known *yet* (a registry follower
    may not have it), so the id is waited for like an unknown one, never kept as unreadable."""


class _Resolver:
    """One schema id's files. ``plain`` and ``serialized`` are two registry clients (each
    caches what it fetched by id and by subject version, whatever the format asked)."""

    def __init__(self, plain: Any, serialized: Any) -> None:
        self._plain = plain
        self._serialized = serialized
        self._well_known = _well_known()
        self._files: dict[str, bytes] = {}

    def files(self, sid: int) -> ProtoFiles | None:
        schema = self._plain.get_schema(sid)
        if schema.schema_type != "PROTOBUF":
            # As for Avro: an id of another type is no writer of this format.
            log.warning("schema_id_not_protobuf", schema_id=sid, type=schema.schema_type)
            return None
        proto = _from_base64(schema.schema_str)
        if proto is None:
            proto = _from_base64(self._serialized.get_schema(sid, fmt="serialized").schema_str)
        if proto is None:
            raise Unreadable("neither the schema nor its serialized form is a base64 FileDescriptorProto")
        if not proto.name:
            proto.name = f"ingest-writer-{sid}.proto"
        self._add(proto, schema.references or [])
        return tuple(self._files.values())

    def _add(self, proto: Any, references: list[Any]) -> None:
        by_name = {ref.name: ref for ref in references}
        for dependency in proto.dependency:
            if dependency in self._files:
                continue
            ref = by_name.get(dependency)
            if ref is not None and ref.subject is not None and ref.version is not None:
                self._add_reference(dependency, ref.subject, int(ref.version))
            elif dependency in self._well_known:
                self._files[dependency] = self._well_known[dependency]
            else:
                raise Unreadable(f"imports {dependency!r}, which is neither a reference nor a well-known type")
        self._files[proto.name] = proto.SerializeToString()

    def _add_reference(self, name: str, subject: str, version: int) -> None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._plain.get_version(subject, version)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:  # the id is known, one of its imports is not (yet)
                raise ReferenceNotFound(f"reference {name!r}: subject {subject!r} has no version {version}") from exc
            raise
        proto = _from_base64(registered.schema.schema_str)
        if proto is None:
            registered = self._serialized.get_version(subject, version, fmt="serialized")
            proto = _from_base64(registered.schema.schema_str)
        if proto is None:
            raise Unreadable(f"reference {name!r} (subject {subject!r} version {version}) is not readable")
        # The importing file names it by this name, whatever the registry called it.
        proto.name = name
        self._add(proto, registered.schema.references or [])


def schema_files(plain: Any, serialized: Any, sid: int, registry: str) -> ProtoFiles | None:
    """The files of writer schema ``sid``: None when it is not a Protobuf schema, ``()`` when
    it cannot be read here (both logged). The registry client's errors (a 404 for an unknown
    id, no answer) and :class:`ReferenceNotFound` go to the caller."""
    try:
        return _Resolver(plain, serialized).files(sid)
    except Unreadable as exc:
        log.warning("protobuf_schema_unreadable", registry=registry, schema_id=sid, reason=str(exc))
        return ()
