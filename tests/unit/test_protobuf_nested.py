"""Protobuf messages, repeated messages, maps and bytes into struct, array, map and binary
columns, with protobuf's own example schema (``examples/addressbook.proto`` of
protocolbuffers/protobuf, BSD-3-Clause; built here from descriptors, there is no protoc) and a
message of maps:

    // tutorial/addressbook.proto
    syntax = "proto3"; package tutorial; import "google/protobuf/timestamp.proto";
    message Person { string name = 1; int32 id = 2; string email = 3;
      enum PhoneType { PHONE_TYPE_UNSPECIFIED = 0; PHONE_TYPE_MOBILE = 1; PHONE_TYPE_HOME = 2;
                       PHONE_TYPE_WORK = 3; }
      message PhoneNumber { string number = 1; PhoneType type = 2; }
      repeated PhoneNumber phones = 4; google.protobuf.Timestamp last_updated = 5; }
    message AddressBook { repeated Person people = 1; }
    // added here: message Extras { map<string, int64> counts = 1; bytes blob = 2;
    //                              map<string, Person> by_name = 3; Person owner = 4; }
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from ingest.formats.protobuf import Decoder
from tests.protobuf_orders import frame

_F = descriptor_pb2.FieldDescriptorProto
_T = datetime(2026, 12, 7, 10, 0, 0, 123456, tzinfo=UTC)


def _add(msg: Any, name: str, number: int, ftype: int, type_name: str = "", repeated: bool = False) -> None:
    field = msg.field.add(name=name, number=number, type=ftype)
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        field.type_name = type_name


def _map_entry(msg: Any, name: str, value_type: int, value_type_name: str = "") -> None:
    entry = msg.nested_type.add(name=name)
    entry.options.map_entry = True
    _add(entry, "key", 1, _F.TYPE_STRING)
    _add(entry, "value", 2, value_type, value_type_name)


def addressbook_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="tutorial/addressbook.proto", package="tutorial", syntax="proto3")
    f.dependency.append("google/protobuf/timestamp.proto")
    person = f.message_type.add(name="Person")
    _add(person, "name", 1, _F.TYPE_STRING)
    _add(person, "id", 2, _F.TYPE_INT32)
    _add(person, "email", 3, _F.TYPE_STRING)
    phone_type = person.enum_type.add(name="PhoneType")
    for number, name in enumerate(
        ("PHONE_TYPE_UNSPECIFIED", "PHONE_TYPE_MOBILE", "PHONE_TYPE_HOME", "PHONE_TYPE_WORK")
    ):
        phone_type.value.add(name=name, number=number)
    phone = person.nested_type.add(name="PhoneNumber")
    _add(phone, "number", 1, _F.TYPE_STRING)
    _add(phone, "type", 2, _F.TYPE_ENUM, ".tutorial.Person.PhoneType")
    _add(person, "phones", 4, _F.TYPE_MESSAGE, ".tutorial.Person.PhoneNumber", repeated=True)
    _add(person, "last_updated", 5, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    book = f.message_type.add(name="AddressBook")
    _add(book, "people", 1, _F.TYPE_MESSAGE, ".tutorial.Person", repeated=True)
    extras = f.message_type.add(name="Extras")
    _map_entry(extras, "CountsEntry", _F.TYPE_INT64)
    _add(extras, "counts", 1, _F.TYPE_MESSAGE, ".tutorial.Extras.CountsEntry", repeated=True)
    _add(extras, "blob", 2, _F.TYPE_BYTES)
    _map_entry(extras, "ByNameEntry", _F.TYPE_MESSAGE, ".tutorial.Person")
    _add(extras, "by_name", 3, _F.TYPE_MESSAGE, ".tutorial.Extras.ByNameEntry", repeated=True)
    _add(extras, "owner", 4, _F.TYPE_MESSAGE, ".tutorial.Person")
    return f


def addressbook_classes() -> tuple[Any, Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(addressbook_file())
    get = message_factory.GetMessageClass
    return tuple(get(pool.FindMessageTypeByName(f"tutorial.{n}")) for n in ("Person", "AddressBook", "Extras"))


FILES = (timestamp_pb2.DESCRIPTOR.serialized_pb, addressbook_file().SerializeToString())
PERSON = "struct<name:string,id:int,phones:array<struct<number:string,type:string>>,last_updated:timestamp>"


def _decode(columns: dict[str, str], values: list[bytes]) -> list[dict[str, Any]]:
    decoder = Decoder({1: FILES}, tuple(columns.items()), "_timestamp")
    batch = pa.record_batch({"_offset": pa.array(range(len(values)), pa.int64()), "_value": pa.array(values)})
    return decoder.decode(batch).to_pylist()


def person_message(cls: Any, i: int) -> Any:
    person = cls(name=f"p{i}", id=i, email=f"p{i}@example.com")
    person.phones.add(number=f"555-{i}", type=1)
    person.phones.add(number=f"556-{i}", type=3)
    person.last_updated.FromDatetime(_T)
    return person


def person_read(i: int) -> dict[str, Any]:
    return {
        "name": f"p{i}",
        "id": i,
        "phones": [
            {"number": f"555-{i}", "type": "PHONE_TYPE_MOBILE"},
            {"number": f"556-{i}", "type": "PHONE_TYPE_WORK"},
        ],
        "last_updated": _T,
    }


def test_repeated_messages_are_arrays_of_structs_at_any_depth() -> None:
    person, book, _ = addressbook_classes()
    value = book(people=[person_message(person, 1), person_message(person, 2)]).SerializeToString()
    [row] = _decode({"people": f"array<{PERSON}>"}, [frame(1, [1], value)])
    assert row["_reason"] is None
    assert row["people"] == [person_read(1), person_read(2)]


def test_maps_bytes_and_messages_are_maps_binary_and_structs() -> None:
    person, _, extras = addressbook_classes()
    msg = extras(counts={"a": 1, "b": -(2**63)}, blob=b"\x00\xff", owner=person_message(person, 3))
    msg.by_name["x"].CopyFrom(person_message(person, 4))
    empty = extras()
    columns = {"counts": "map<string,long>", "blob": "binary", "by_name": f"map<string,{PERSON}>", "owner": PERSON}
    rows = _decode(columns, [frame(1, [2], msg.SerializeToString()), frame(1, [2], empty.SerializeToString())])
    assert [r["_reason"] for r in rows] == [None, None]
    assert sorted(rows[0]["counts"]) == [("a", 1), ("b", -(2**63))]
    assert (rows[0]["blob"], rows[0]["by_name"], rows[0]["owner"]) == (
        b"\x00\xff",
        [("x", person_read(4))],
        person_read(3),
    )
    # proto3: an unset message is null, an empty map and bytes their defaults.
    assert (rows[1]["counts"], rows[1]["blob"], rows[1]["owner"]) == ([], b"", None)


def test_a_path_through_a_repeated_message_or_a_mismatched_type_is_unresolvable_not_null() -> None:
    person, book, extras = addressbook_classes()
    value = book(people=[person_message(person, 1)]).SerializeToString()
    [through] = _decode({"people__name": "string"}, [frame(1, [1], value)])
    assert through["_reason"] == "unresolvable"
    [as_scalar] = _decode({"people": "string"}, [frame(1, [1], value)])
    assert as_scalar["_reason"] == "unresolvable"
    [map_as_array] = _decode({"counts": "array<string>"}, [frame(1, [2], extras(counts={"a": 1}).SerializeToString())])
    assert map_as_array["_reason"] == "unresolvable"
