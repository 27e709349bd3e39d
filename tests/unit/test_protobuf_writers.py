"""Protobuf writer schemas as registries give them: the base64 FileDescriptorProto itself
(Apicurio, holding what confluent-kafka's serializer registered), or ``.proto`` text with the
serialized form on ``?format=serialized`` (Confluent's registry); imports through references,
well-known types from the protobuf package. Fake clients stand for the two registries, whose
answers are as recorded from Apicurio 3.3.3 and as Confluent's API documents them."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaReference
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2, timestamp_pb2

from ingest.formats.protobuf import Decoder
from ingest.formats.protobuf_schemas import ReferenceNotFound, schema_files
from tests.protobuf_orders import OrderVersion, customer_file, frame, order_file, when

REFS = [SchemaReference("acme/customer.proto", "acme/customer.proto", 1)]
TEXT = 'syntax = "proto3";\npackage acme;\nmessage Order { int64 id = 1; }\n'


def b64(proto: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.standard_b64encode(proto.SerializeToString()).decode()


@dataclass
class FakeClient:
    """Answers get_schema(id) and get_version(subject, version) from a table; records calls."""

    by_id: dict[int, Schema]
    by_version: dict[tuple[str, int], Schema] = field(default_factory=dict)
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def get_schema(self, sid: int, fmt: str | None = None) -> Schema:
        self.calls.append(("id", sid, fmt))
        if sid not in self.by_id:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.by_id[sid]

    def get_version(self, subject: str, version: int, fmt: str | None = None) -> RegisteredSchema:
        self.calls.append(("version", subject, version, fmt))
        if (subject, version) not in self.by_version:
            raise SchemaRegistryError(404, 40402, "Version not found")
        return RegisteredSchema(subject, version, 1, None, self.by_version[(subject, version)])


def names(files: tuple[bytes, ...] | None) -> list[str]:
    assert files is not None
    return [descriptor_pb2.FileDescriptorProto.FromString(f).name for f in files]


def test_apicurio_gives_the_registered_base64_and_no_serialized_form_is_asked() -> None:
    plain = FakeClient(
        {1: Schema(b64(order_file(1)), "PROTOBUF", REFS)},
        {("acme/customer.proto", 1): Schema(b64(customer_file()), "PROTOBUF")},
    )
    serialized = FakeClient({})
    files = schema_files(plain, serialized, 1, "http://r")
    assert names(files) == ["google/protobuf/timestamp.proto", "acme/customer.proto", "acme/order.proto"]
    assert files is not None and files[0] == timestamp_pb2.DESCRIPTOR.serialized_pb
    assert serialized.calls == []


def test_confluent_gives_text_and_the_serialized_form_on_request() -> None:
    unnamed = order_file(1)
    unnamed.ClearField("name")
    # A reference's file is named as the importing file imports it, whatever the registry says.
    renamed = customer_file()
    renamed.name = "customer-from-the-registry.proto"
    plain = FakeClient(
        {1: Schema(TEXT, "PROTOBUF", REFS)}, {("acme/customer.proto", 1): Schema("message Customer {}", "PROTOBUF")}
    )
    serialized = FakeClient(
        {1: Schema(b64(unnamed), "PROTOBUF", REFS)},
        {("acme/customer.proto", 1): Schema(b64(renamed), "PROTOBUF")},
    )
    files = schema_files(plain, serialized, 1, "http://r")
    assert names(files) == ["google/protobuf/timestamp.proto", "acme/customer.proto", "ingest-writer-1.proto"]
    # They load (imports resolve) and decode.
    decoder = Decoder({1: files or ()}, (("id", "long"), ("ts", "timestamp")), "ts")
    msg = OrderVersion.make(1).Order(id=3)
    msg.ts.FromDatetime(when(1))
    batch = pa.record_batch({"_value": pa.array([frame(1, [1], msg.SerializeToString())], pa.binary())})
    assert decoder.decode(batch).to_pylist()[0]["id"] == 3
    assert ("id", 1, "serialized") in serialized.calls
    assert ("version", "acme/customer.proto", 1, "serialized") in serialized.calls


def test_a_reference_the_registry_does_not_have_is_not_known_yet_never_unreadable() -> None:
    """A follower registry may not have replicated the import yet: the id is waited for like an
    unknown one (ingest.builder.writer_schemas), never kept as unreadable."""
    gone = FakeClient({1: Schema(b64(order_file(1)), "PROTOBUF", REFS)})
    with pytest.raises(ReferenceNotFound, match=r"acme/customer\.proto"):
        schema_files(gone, gone, 1, "http://r")


def test_unreadable_schemas_are_empty_and_other_types_none() -> None:
    text_only = FakeClient({1: Schema(TEXT, "PROTOBUF")})
    assert schema_files(text_only, text_only, 1, "http://r") == ()
    # An import nobody references.
    no_refs = FakeClient({1: Schema(b64(order_file(1)), "PROTOBUF")})
    assert schema_files(no_refs, no_refs, 1, "http://r") == ()
    avro = FakeClient({1: Schema('{"type": "string"}', "AVRO")})
    assert schema_files(avro, avro, 1, "http://r") is None
