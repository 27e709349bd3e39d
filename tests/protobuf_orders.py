"""Protobuf messages for the tests, made from FileDescriptorProtos (no protoc here), two
versions of one file, as two services' builds would register them:

    // acme/customer.proto
    message Customer { string name = 1; Address address = 2;
                       message Address { string city = 1; } }
    // acme/order.proto, v1
    import "google/protobuf/timestamp.proto"; import "acme/customer.proto";
    enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
    message Note { string text = 1; }
    message Order { int64 id = 1; google.protobuf.Timestamp ts = 2; Status status = 3;
                    repeated string tags = 4; Customer customer = 5; double amount = 6;
                    message Line { int64 sku = 1; } }
    // v2 adds: int32 quantity = 7; repeated google.protobuf.Timestamp seen = 8;

``Order`` is the file's second message: its records carry the index list [1], not the one
byte of [0]. Each version lives in its own descriptor pool, as it would in its own service.

And values no column may hold, in a file of its own (proto2, whose strings are not checked as
UTF-8 when parsed; the same file as proto3 is parsed with the check):

    // acme/reading.proto
    syntax = "proto2"; import "google/protobuf/timestamp.proto";
    message Reading { optional int64 id = 1; optional google.protobuf.Timestamp ts = 2;
                      optional string name = 3; repeated string tags = 4; optional Place place = 5;
                      optional int64 big = 6; optional uint64 huge = 7; optional int32 small = 8;
                      repeated int64 bigs = 9;
                      message Place { optional string city = 1; } }
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from ingest_dev.registry import client as registry_client

_F = descriptor_pb2.FieldDescriptorProto


def _field(msg: Any, name: str, number: int, ftype: int, type_name: str = "", repeated: bool = False) -> None:
    label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    field = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        field.type_name = type_name


def customer_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="acme/customer.proto", package="acme", syntax="proto3")
    customer = f.message_type.add(name="Customer")
    _field(customer, "name", 1, _F.TYPE_STRING)
    _field(customer, "address", 2, _F.TYPE_MESSAGE, ".acme.Customer.Address")
    _field(customer.nested_type.add(name="Address"), "city", 1, _F.TYPE_STRING)
    return f


def order_file(version: int) -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="acme/order.proto", package="acme", syntax="proto3")
    f.dependency.extend(["google/protobuf/timestamp.proto", "acme/customer.proto"])
    status = f.enum_type.add(name="Status")
    for number, name in enumerate(("NEW", "PAID", "SHIPPED")):
        status.value.add(name=name, number=number)
    _field(f.message_type.add(name="Note"), "text", 1, _F.TYPE_STRING)
    order = f.message_type.add(name="Order")
    _field(order, "id", 1, _F.TYPE_INT64)
    _field(order, "ts", 2, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    _field(order, "status", 3, _F.TYPE_ENUM, ".acme.Status")
    _field(order, "tags", 4, _F.TYPE_STRING, repeated=True)
    _field(order, "customer", 5, _F.TYPE_MESSAGE, ".acme.Customer")
    _field(order, "amount", 6, _F.TYPE_DOUBLE)
    _field(order.nested_type.add(name="Line"), "sku", 1, _F.TYPE_INT64)
    if version >= 2:
        _field(order, "quantity", 7, _F.TYPE_INT32)
        _field(order, "seen", 8, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp", repeated=True)
    return f


@dataclass(frozen=True)
class OrderVersion:
    """One version's message classes (its own pool)."""

    Order: Any
    Note: Any
    Customer: Any

    @classmethod
    def make(cls, version: int) -> OrderVersion:
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
        pool.Add(customer_file())
        pool.Add(order_file(version))

        def get(name: str) -> Any:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

        return cls(get("acme.Order"), get("acme.Note"), get("acme.Customer"))


#: The spec's columns for these messages: nested fields by ``__`` paths, v2's int32 read as long.
ORDER_COLUMNS = {
    "id": "long",
    "ts": "timestamp",
    "status": "string",
    "tags": "array<string>",
    "customer__name": "string",
    "customer__address__city": "string",
    "amount": "double",
    "quantity": "long",
    "seen": "array<timestamp>",
}


def when(i: int) -> datetime:
    return datetime(2026, 11, 25, 10, 0, i % 60, 123456, tzinfo=UTC)


def order(v: OrderVersion, i: int, **extra: Any) -> Any:
    customer = v.Customer(name=f"user-{i % 7}", address=v.Customer.Address(city=f"city-{i % 3}"))
    msg = v.Order(id=i, status=i % 3, tags=["x", str(i % 3)], customer=customer, amount=i / 2, **extra)
    msg.ts.FromDatetime(when(i))
    return msg


def serializer(registry_url: str, message_class: Any) -> ProtobufSerializer:
    return ProtobufSerializer(message_class, registry_client(registry_url), {"auto.register.schemas": True})


def framed(registry_url: str, message_class: Any, ctx: SerializationContext) -> Any:
    """A function of a message: its bytes in the Confluent wire format (schema registered)."""
    ser = serializer(registry_url, message_class)

    def encode(msg: Any) -> bytes:
        value = ser(msg, ctx)
        assert value is not None
        return bytes(value)

    return encode


def writer_files(version: int) -> tuple[bytes, ...]:
    """What the registry gives the decoder for one version: its files, dependencies first."""
    return (
        timestamp_pb2.DESCRIPTOR.serialized_pb,
        customer_file().SerializeToString(),
        order_file(version).SerializeToString(),
    )


def frame(sid: int, indexes: list[int], body: bytes) -> bytes:
    """The Confluent wire format of a message, as confluent-kafka's serializer frames it."""
    import io

    buf = io.BytesIO()
    ProtobufSerializer._encode_varints(buf, indexes)
    return b"\x00" + sid.to_bytes(4, "big") + buf.getvalue() + body


def reading_file(syntax: str = "proto2") -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="acme/reading.proto", package="acme", syntax=syntax)
    f.dependency.append("google/protobuf/timestamp.proto")
    reading = f.message_type.add(name="Reading")
    _field(reading, "id", 1, _F.TYPE_INT64)
    _field(reading, "ts", 2, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    _field(reading, "name", 3, _F.TYPE_STRING)
    _field(reading, "tags", 4, _F.TYPE_STRING, repeated=True)
    _field(reading, "place", 5, _F.TYPE_MESSAGE, ".acme.Reading.Place")
    _field(reading, "big", 6, _F.TYPE_INT64)
    _field(reading, "huge", 7, _F.TYPE_UINT64)
    _field(reading, "small", 8, _F.TYPE_INT32)
    _field(reading, "bigs", 9, _F.TYPE_INT64, repeated=True)
    _field(reading.nested_type.add(name="Place"), "city", 1, _F.TYPE_STRING)
    return f


#: The spec's columns for Reading: integers read into floating-point columns.
READING_COLUMNS = {
    "id": "long",
    "ts": "timestamp",
    "name": "string",
    "tags": "array<string>",
    "place__city": "string",
    "big": "double",
    "huge": "double",
    "small": "float",
    "bigs": "array<double>",
}


def reading_class(syntax: str = "proto2") -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(reading_file(syntax))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Reading"))


def reading_files(syntax: str = "proto2") -> tuple[bytes, ...]:
    return (timestamp_pb2.DESCRIPTOR.serialized_pb, reading_file(syntax).SerializeToString())


def reading(cls: Any, i: int, **fields: Any) -> Any:
    values = {
        "id": i,
        "name": f"r-{i}",
        "tags": ["a"],
        "place": cls.Place(city="here"),
        "big": i,
        "huge": i,
        "small": i,
    }
    msg = cls(**{**values, **fields})
    msg.ts.FromDatetime(when(i))
    return msg


def string_field(number: int, raw: bytes) -> bytes:
    """A length-delimited field as it is on the wire, whatever its bytes (the message API only
    sets UTF-8 strings); appended to a message, it replaces a singular field (a message field:
    merges into it) and adds an element to a repeated one."""
    assert len(raw) < 128
    return bytes([number << 3 | 2, len(raw)]) + raw
