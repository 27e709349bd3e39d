"""A batch's writer schemas against a fake registry client: ids fetched once are cached and
keep serving through an outage; during one, only the splits holding an id not fetched yet
wait (RegistryUnavailable), the rest of the batch builds; an id the registry does not know is
left out (its records become rejects), never a wait."""

from __future__ import annotations

import dataclasses
import uuid

from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from ingest.builder.writer_schemas import RegistryUnavailable, WriterSchemas
from ingest.formats import RegistrySettings
from ingest.splits.chunks import chunks_of
from ingest.splits.split import KillSwitch, SealedSplit, SyntheticRecord
from ingest_common.model import TopicPartition

REGISTRY = RegistrySettings("http://127.0.0.1:1/apis/ccompat/v7")
SCHEMAS = {1: '"long"', 2: '"string"', 3: '"double"'}


class FakeRegistryClient:
    def __init__(self) -> None:
        self.down = False
        self.asked: list[int] = []

    def get_schema(self, sid: int) -> Schema:
        self.asked.append(sid)
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        if sid not in SCHEMAS:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return Schema(SCHEMAS[sid], "AVRO")


def split_with(partition: int, *ids: int) -> SealedSplit:
    """A split of records framed with these schema ids (one record each)."""
    records = tuple(
        SyntheticRecord(o, b"\x00" + sid.to_bytes(4, "big") + b"\x02", partition=partition) for o, sid in enumerate(ids)
    )
    return SealedSplit(
        id=uuid.uuid4(),
        tp=TopicPartition("t", partition),
        serial=1,
        start=0,
        end=len(records),
        chunks=chunks_of(records),
        size_bytes=10,
        first_record_at=0.0,
        sealed_at=0.0,
        seal_reason="test",
        kill_switch=KillSwitch(),
    )


def test_cached_ids_serve_through_an_outage_and_only_splits_needing_new_ids_wait() -> None:
    client = FakeRegistryClient()
    schemas = WriterSchemas(lambda _settings: client)
    first = schemas.for_batch([split_with(0, 1, 1, 99)], REGISTRY)
    # 99 is unknown (404): left out, its record a reject; never a wait.
    assert (first.schemas, first.waiting) == ({1: SCHEMAS[1]}, {})

    client.down = True
    client.asked.clear()
    cached, needs_2, needs_2_and_3 = split_with(0, 1), split_with(1, 1, 2), split_with(2, 3, 1)
    batch = schemas.for_batch([cached, needs_2, needs_2_and_3], REGISTRY)
    assert batch.schemas == {1: SCHEMAS[1]}  # the cached id serves the split that builds
    assert set(batch.waiting) == {needs_2.id, needs_2_and_3.id}
    assert all(isinstance(e, RegistryUnavailable) for e in batch.waiting.values())
    assert "Connection refused" in str(batch.waiting[needs_2.id])
    # Asked once for the first id not cached, not again for the next in the same batch.
    assert client.asked == [2]

    client.down = False
    again = schemas.for_batch([needs_2, needs_2_and_3], REGISTRY)
    assert (again.schemas, again.waiting) == ({sid: SCHEMAS[sid] for sid in (1, 2, 3)}, {})
    client.down = True
    client.asked.clear()
    # Every id fetched once now: an outage changes nothing for them.
    later = schemas.for_batch([dataclasses.replace(needs_2_and_3, id=uuid.uuid4())], REGISTRY)
    assert (later.waiting, client.asked) == ({}, [])
