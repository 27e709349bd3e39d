"""The bench's records in Avro, in the Confluent wire format (``--format avro``).

The same records as the JSON data set (bench/data.py), each encoded with one fixed writer schema
registered once in the schema registry the bench starts (Apicurio, ingest_dev/registry.py), and
framed as a zero magic byte, the 4-byte big-endian schema id, then the Avro body. The format is
one per bench run: :func:`activate` switches every producer of the run (the data set, the steady
phases, the freshness probes) to it, and the systems read it as such: the workers with
``format = "avro"`` and a ``[registry]`` section, Spark Structured Streaming with ``from_avro``
over the value without its 5-byte header. The raw baseline and Quix Streams parse JSON only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import fastavro

from ingest.formats.wire import HEADER_BYTES, MAGIC_BYTE
from ingest_dev.registry import client as registry_client

# The writer schema: the bench's SCHEMA (bench/data.py) as Avro, no field nullable.
WRITER_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "bench_record",
        "namespace": "bench",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "user", "type": "string"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "amount", "type": "double"},
            {"name": "country", "type": "string"},
            {"name": "device", "type": "string"},
            {"name": "session", "type": "string"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "page", "type": "string"},
        ],
    },
    separators=(",", ":"),
)
SUBJECT = "bench-value"


@dataclass(frozen=True)
class AvroWire:
    registry_url: str
    schema_id: int
    parsed: Any

    def encode(self, doc: dict[str, Any]) -> bytes:
        """``doc`` (``ts`` in epoch milliseconds) framed in the Confluent wire format."""
        out = io.BytesIO()
        out.write(bytes([MAGIC_BYTE]) + self.schema_id.to_bytes(HEADER_BYTES - 1, "big"))
        fastavro.schemaless_writer(out, self.parsed, doc)
        return out.getvalue()


_active: AvroWire | None = None


def wire(registry_url: str, schema_id: int) -> AvroWire:
    return AvroWire(registry_url, schema_id, fastavro.parse_schema(json.loads(WRITER_SCHEMA)))


def activate(registry_url: str) -> AvroWire:
    """Register the writer schema and make every record of this run Avro."""
    from confluent_kafka.schema_registry import Schema

    global _active
    schema_id = registry_client(registry_url).register_schema(SUBJECT, Schema(WRITER_SCHEMA, "AVRO"))
    _active = wire(registry_url, int(schema_id))
    return _active


def active() -> AvroWire | None:
    """The run's Avro framing, None when its records are JSON."""
    return _active
