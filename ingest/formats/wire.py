"""The record formats a spec names and the Confluent wire format that frames all but json: a
zero magic byte, a 4-byte big-endian schema id, then the body (for Protobuf a message-index
list before it, ingest.formats.protobuf). What a record's key is decoded as, and the columns
a decoded key becomes.
"""

from __future__ import annotations

#: Formats of a spec; all but json are framed (Confluent wire format).
FORMATS = ("json", "avro", "json_schema", "protobuf")
FRAMED_FORMATS = ("avro", "json_schema", "protobuf")
#: What a record's key is decoded as (``key_format``): kept as bytes in ``_key`` only (binary),
#: UTF-8 text, or a framed format read with the spec's ``[key_schema]``. ``_key`` always stays.
KEY_FORMATS = ("binary", "string", "avro", "json_schema")
#: Decoded key fields are output columns named with this prefix; spec columns cannot start
#: with "_", so they clash with none. A string key is the one column ``_key_string``.
KEY_COLUMN_PREFIX = "_key_"
STRING_KEY_COLUMN = "_key_string"
#: The Kafka record's timestamp column of every row; a spec's ``event_time`` may name it.
KAFKA_TIMESTAMP = "_timestamp"
HEADER_BYTES = 5
MAGIC_BYTE = 0


def schema_id(value: bytes | None) -> int | None:
    """The schema id of a Confluent-framed value, or None when it is not framed."""
    if value is None or len(value) < HEADER_BYTES or value[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(value[1:HEADER_BYTES], "big")
