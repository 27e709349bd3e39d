"""Avro sample data in the Confluent wire format for the demo and the chaos run: writer schemas
registered in a schema registry under a topic's subjects (the topic strategy: ``<topic>-value``
and ``<topic>-key``), records framed by hand (the zero magic byte, the 4-byte schema id, then
fastavro's body), which keeps producing tens of thousands of records a matter of a second.

The sample schemas are versions of one record: ``CLICK_V2`` adds a field with a default to
``CLICK_V1``, so a reader of either resolves records of both; ``CLICK_KEY`` is the key.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import fastavro

from ingest.formats.wire import MAGIC_BYTE
from ingest_dev.registry import client as registry_client


def _click(*extra: dict[str, Any]) -> str:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        *extra,
    ]
    return json.dumps({"type": "record", "name": "Click", "namespace": "demo", "fields": fields})


CLICK_V1 = _click()
CLICK_V2 = _click({"name": "region", "type": "string", "default": "eu"})
CLICK_V3 = _click(
    {"name": "region", "type": "string", "default": "eu"}, {"name": "score", "type": "long", "default": 0}
)
CLICK_KEY = json.dumps(
    {"type": "record", "name": "ClickKey", "namespace": "demo", "fields": [{"name": "user", "type": "string"}]}
)
#: The spec's columns that read every version above (a version without a field gives null).
CLICK_COLUMNS = {
    "id": "long",
    "user": "string",
    "ts": "timestamp",
    "amount": "double",
    "tags": "array<string>",
    "region": "string",
}


def register(registry_url: str, subject: str, schema: str) -> int:
    """Register ``schema`` (Avro) under ``subject``; its id (the same text gets the same id)."""
    from confluent_kafka.schema_registry import Schema

    return int(registry_client(registry_url).register_schema(subject, Schema(schema, "AVRO")))


class AvroWriter:
    """Records of one writer schema, each framed with its schema id."""

    def __init__(self, schema: str, schema_id: int) -> None:
        self._schema = fastavro.parse_schema(json.loads(schema))
        self.header = bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big")

    def __call__(self, record: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self._schema, record)
        return buf.getvalue()

    def undecodable(self) -> bytes:
        """A value framed with this id whose body does not decode (a long, then nothing)."""
        return self.header + b"\x02"


def writers(registry_url: str, topic: str, versions: tuple[str, ...]) -> list[AvroWriter]:
    """One writer per schema version, each registered under ``<topic>-value`` in order."""
    return [AvroWriter(schema, register(registry_url, f"{topic}-value", schema)) for schema in versions]


def key_writer(registry_url: str, topic: str) -> AvroWriter:
    """The writer of :data:`CLICK_KEY`, registered under ``<topic>-key``."""
    return AvroWriter(CLICK_KEY, register(registry_url, f"{topic}-key", CLICK_KEY))
