"""The Confluent Protobuf framing (schema id, message-index list) and the decoder that runs in
Spark's Python workers, on Arrow batches without Spark: every record gets its columns or
exactly one reason."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2
from hypothesis import example, given
from hypothesis import strategies as st

from ingest.formats.protobuf import MAX_INDEXES, BadFraming, Decoder, parse_header
from tests.protobuf_orders import (
    ORDER_COLUMNS,
    READING_COLUMNS,
    OrderVersion,
    frame,
    order,
    reading,
    reading_class,
    reading_files,
    string_field,
    when,
    writer_files,
)

indexes = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=MAX_INDEXES)


@given(st.integers(0, 2**32 - 1), indexes, st.binary(max_size=20))
@example(7, [0], b"")
@example(7, [1, 0], b"\x08\x01")
def test_a_framed_value_gives_its_id_indexes_and_body(sid: int, path: list[int], body: bytes) -> None:
    value = frame(sid, path, body)
    got_sid, got_path, start = parse_header(value)
    assert (got_sid, list(got_path), value[start:]) == (sid, path, body)


@given(st.integers(0, 2**32 - 1), indexes)
def test_a_cut_header_is_bad_framing(sid: int, path: list[int]) -> None:
    header = frame(sid, path, b"")
    for cut in range(len(header)):
        with pytest.raises(BadFraming):
            parse_header(header[:cut])


@given(st.binary(max_size=30))
def test_any_bytes_parse_or_are_bad_framing(value: bytes) -> None:
    try:
        _, path, start = parse_header(value)
    except BadFraming:
        return
    # What parses is framed: the magic byte, a whole index list, a body (maybe empty) after it.
    assert value[0] == 0 and 6 <= start <= len(value) and 1 <= len(path) <= MAX_INDEXES


@pytest.mark.parametrize(
    "value",
    [
        b"\x01\x00\x00\x00\x01\x00",  # magic 1
        b"\x00\x00\x00\x01",  # no index list
        b"\x00\x00\x00\x00\x01\x01",  # count -1
        b"\x00\x00\x00\x00\x01" + bytes([(MAX_INDEXES + 1) * 2]),  # too many indexes
        b"\x00\x00\x00\x00\x01" + b"\xff" * 11,  # an overlong varint
    ],
)
def test_bad_headers(value: bytes) -> None:
    with pytest.raises(BadFraming):
        parse_header(value)


V1, V2 = OrderVersion.make(1), OrderVersion.make(2)


def decode(
    decoder: Decoder, values: list[bytes | None], columns: dict[str, str] = ORDER_COLUMNS
) -> list[dict[str, Any]]:
    batch = pa.record_batch(
        {"_offset": pa.array(range(len(values)), pa.int64()), "_value": pa.array(values, pa.binary())}
    )
    out = decoder.decode(batch)
    assert out.schema.names == ["_offset", "_value", *columns, "_reason"]
    return out.to_pylist()


def test_two_writers_nested_repeated_enum_timestamp_into_the_spec_columns() -> None:
    decoder = Decoder({1: writer_files(1), 2: writer_files(2)}, tuple(ORDER_COLUMNS.items()), "ts")
    v2 = order(V2, 4, quantity=3)
    v2.seen.add().FromDatetime(when(9))
    rows = decode(decoder, [frame(1, [1], order(V1, 2).SerializeToString()), frame(2, [1], v2.SerializeToString())])
    assert rows[0] == {
        "_offset": 0,
        "_value": rows[0]["_value"],
        "id": 2,
        "ts": when(2),
        "status": "SHIPPED",
        "tags": ["x", "2"],
        "customer__name": "user-2",
        "customer__address__city": "city-2",
        "amount": 1.0,
        # Fields v1 does not have.
        "quantity": None,
        "seen": None,
        "_reason": None,
    }
    assert (rows[1]["status"], rows[1]["quantity"], rows[1]["seen"], rows[1]["_reason"]) == ("PAID", 3, [when(9)], None)


def test_unset_fields_with_presence_are_null_and_without_are_their_default() -> None:
    decoder = Decoder({1: writer_files(1)}, tuple(ORDER_COLUMNS.items()), "ts")
    msg = V1.Order(id=0)
    msg.ts.FromDatetime(when(1))
    [row] = decode(decoder, [frame(1, [1], msg.SerializeToString())])
    assert (row["id"], row["status"], row["tags"], row["amount"], row["_reason"]) == (0, "NEW", [], 0.0, None)
    assert row["customer__name"] is None and row["customer__address__city"] is None


def test_each_bad_record_has_one_reason() -> None:
    decoder = Decoder({1: writer_files(1), 3: ()}, tuple(ORDER_COLUMNS.items()), "ts")
    good = order(V1, 1).SerializeToString()
    unknown_status = order(V1, 1)
    unknown_status.status = 7  # open enum: sent, but not a value of the writer's Status
    values: dict[str, list[bytes | None]] = {
        "null_value": [None],
        "not_confluent_framed": [b"\x01" + frame(1, [1], good)[1:], b"\x00\x00", frame(1, [1], good)[:5]],
        "unknown_schema_id": [frame(99, [1], good)],
        "unknown_message_index": [frame(1, [2], good), frame(1, [1, 1], good), frame(1, [-1], good)],
        "undecodable": [frame(1, [1], b"\x08"), frame(1, [1], b"\x12\x05ab")],
        "unresolvable": [frame(1, [1], unknown_status.SerializeToString()), frame(3, [0], good)],
        "missing_event_time": [frame(1, [1], V1.Order(id=1).SerializeToString()), frame(1, [0], b"")],
    }
    flat = [(reason, value) for reason, vs in values.items() for value in vs]
    rows = decode(decoder, [value for _, value in flat])
    assert [row["_reason"] for row in rows] == [reason for reason, _ in flat]
    assert all(row[c] is None for row in rows for c in ORDER_COLUMNS)


def test_a_column_its_field_cannot_fill_makes_the_writer_unresolvable() -> None:
    good = frame(1, [1], order(V1, 1).SerializeToString())
    for column, ctype in [("tags", "string"), ("id", "int"), ("customer", "string"), ("status", "array<string>")]:
        columns = {**ORDER_COLUMNS, column: ctype}
        decoder = Decoder({1: writer_files(1)}, tuple(columns.items()), "ts")
        batch = pa.record_batch({"_value": pa.array([good], pa.binary())})
        assert decoder.decode(batch).column("_reason").to_pylist() == ["unresolvable"], column


def test_wrappers_are_their_value_and_null_when_unset() -> None:
    from google.protobuf import descriptor_pool, message_factory, wrappers_pb2

    f = descriptor_pb2.FileDescriptorProto(name="w.proto", package="w", syntax="proto3")
    f.dependency.append("google/protobuf/wrappers.proto")
    m = f.message_type.add(name="W")
    m.field.add(
        name="n",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".google.protobuf.Int32Value",
    )
    m.field.add(name="t", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("w.W"))
    decoder = Decoder(
        {5: (wrappers_pb2.DESCRIPTOR.serialized_pb, f.SerializeToString())}, (("n", "long"), ("t", "string")), "t"
    )
    set_, unset = cls(t="a"), cls(t="b")
    set_.n.value = 41
    batch = pa.record_batch(
        {"_value": pa.array([frame(5, [0], m.SerializeToString()) for m in (set_, unset)], pa.binary())}
    )
    out = decoder.decode(batch).to_pylist()
    assert [(r["n"], r["t"], r["_reason"]) for r in out] == [(41, "a", None), (None, "b", None)]


def test_an_integer_a_floating_point_column_does_not_hold_exactly_is_a_reject_of_its_own() -> None:
    """Into double only within +-2**53, into float within +-2**24 (where every integer is exact;
    2**60 is exact in a double, but past the range all the same): pyarrow would refuse any
    other, failing the batch."""
    cls = reading_class()
    decoder = Decoder({4: reading_files()}, tuple(READING_COLUMNS.items()), "ts")
    good = {
        1: reading(cls, 1, big=2**53, huge=2**53, small=2**24, bigs=[-(2**53), 2**53]),
        2: reading(cls, 2, big=-(2**53), small=-(2**24)),
    }
    bad = [
        reading(cls, 3, big=2**53 + 1),
        reading(cls, 4, big=-(2**53) - 1),
        reading(cls, 5, huge=2**64 - 1),
        reading(cls, 6, small=2**24 + 1),
        reading(cls, 7, small=-(2**31)),
        reading(cls, 8, bigs=[1, 2**60]),
    ]
    messages = [good[1], *bad, good[2]]
    rows = decode(decoder, [frame(4, [0], m.SerializeToString()) for m in messages], READING_COLUMNS)
    assert [row["_reason"] for row in rows] == [None, *["unresolvable"] * len(bad), None]
    assert all(row[c] is None for row in rows[1:-1] for c in READING_COLUMNS)
    first, last = rows[0], rows[-1]
    assert (first["id"], first["big"], first["huge"], first["small"], first["bigs"]) == (
        1,
        2.0**53,
        2.0**53,
        2.0**24,
        [-(2.0**53), 2.0**53],
    )
    assert (last["id"], last["big"], last["small"], last["ts"]) == (2, -(2.0**53), -(2.0**24), when(2))


@pytest.mark.parametrize("syntax, reason", [("proto2", "invalid_utf8"), ("proto3", "undecodable")])
def test_a_string_that_is_not_utf8_is_a_reject_of_its_own(syntax: str, reason: str) -> None:
    """proto2 does not check a string's bytes when parsing (upb gives them as bytes): a singular,
    a repeated and a nested string; proto3 does (the body does not decode)."""
    cls = reading_class(syntax)
    decoder = Decoder({4: reading_files(syntax)}, tuple(READING_COLUMNS.items()), "ts")

    def body(i: int) -> bytes:
        return bytes(reading(cls, i).SerializeToString())

    bad = [
        body(2) + string_field(3, b"\xff\xfe"),
        body(3) + string_field(4, b"\xc3\x28"),
        body(4) + string_field(5, string_field(1, b"\xed\xa0\x80")),  # a UTF-16 surrogate
    ]
    bodies = [body(1), *bad, body(5) + string_field(4, "é".encode())]
    rows = decode(decoder, [frame(4, [0], b) for b in bodies], READING_COLUMNS)
    assert [row["_reason"] for row in rows] == [None, *[reason] * len(bad), None]
    assert all(row[c] is None for row in rows[1:-1] for c in READING_COLUMNS)
    assert [(row["id"], row["name"], row["tags"], row["place__city"]) for row in (rows[0], rows[-1])] == [
        (1, "r-1", ["a"], "here"),
        (5, "r-5", ["a", "é"], "here"),
    ]
