"""Writer schemas against a fake registry client: an id served once is kept and serves through
an outage; during one, the ids not served yet are unanswered (their splits wait); an id the
registry answers 404 for is waited for, asked again each time (a failure is never kept), and
only past its wait do its records become rejects; a registry that answers 404 for every id and
never served one is misconfigured. The same against the real registry:
tests/integration/test_schema_registry.py and the builder's tests."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from ingest.builder.writer_schemas import NOT_OF_FORMAT, RegistryMisconfigured, WriterSchemas, resolvable
from ingest.formats.registry import RegistrySettings
from ingest.spec.parse import spec_from_dict
from tests.fakes import FakeClock

REGISTRY = RegistrySettings("http://127.0.0.1:1/apis/ccompat/v7")


class FakeRegistryClient:
    def __init__(self) -> None:
        self.down = False
        self.asked: list[int] = []
        self.schemas: dict[int, Schema] = {1: Schema('"long"', "AVRO"), 2: Schema('"string"', "AVRO")}

    def get_schema(self, sid: int) -> Schema:
        self.asked.append(sid)
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        if sid not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.schemas[sid]


def make(wait_s: float = 60.0) -> tuple[FakeRegistryClient, WriterSchemas, FakeClock]:
    client, clock = FakeRegistryClient(), FakeClock()
    return client, WriterSchemas(lambda _settings: client, wait_s=wait_s, clock=clock), clock


def test_an_id_served_once_is_kept_and_serves_through_an_outage() -> None:
    client, schemas, _ = make()
    assert schemas.fetch(REGISTRY, [1, 2]).learned == {1, 2}
    client.down = True
    again = schemas.fetch(REGISTRY, [1, 2])
    assert again.failure is None and again.learned == frozenset()
    assert schemas.avro(REGISTRY) == {1: '"long"', 2: '"string"'}
    assert client.asked == [1, 2]  # never asked again


def test_during_an_outage_the_ids_not_served_are_unanswered_and_asked_no_further() -> None:
    client, schemas, _ = make()
    schemas.fetch(REGISTRY, [1])
    client.down = True
    fetched = schemas.fetch(REGISTRY, [1, 3, 4])
    assert fetched.failure is not None and "did not answer" in str(fetched.failure)
    assert fetched.unanswered == {3, 4}
    assert client.asked == [1, 3]  # 4 not asked once the registry failed to answer for 3


def test_an_unknown_id_is_waited_for_asked_again_and_learned_once_registered() -> None:
    client, schemas, clock = make(wait_s=60.0)
    schemas.fetch(REGISTRY, [1])  # the registry served an id: it is not misconfigured
    assert schemas.fetch(REGISTRY, [7]).pending == {7}
    clock.advance(30)
    assert schemas.fetch(REGISTRY, [7]).pending == {7}
    client.schemas[7] = Schema('"double"', "AVRO")  # a follower caught up
    assert schemas.fetch(REGISTRY, [7]).learned == {7}
    assert client.asked.count(7) == 3  # every 404 was asked again: none was kept


def test_an_unknown_id_expires_after_its_wait_and_its_records_become_rejects() -> None:
    _, schemas, clock = make(wait_s=60.0)
    schemas.fetch(REGISTRY, [1])
    schemas.fetch(REGISTRY, [7])
    clock.advance(60)
    fetched = schemas.fetch(REGISTRY, [7])
    assert fetched.expired == {7} and fetched.pending == frozenset()


def test_a_registry_that_answers_404_for_every_id_and_never_served_one_is_misconfigured() -> None:
    client, schemas, clock = make(wait_s=60.0)
    client.schemas.clear()  # e.g. a base URL without its API path
    schemas.fetch(REGISTRY, [1, 2])
    clock.advance(60)
    with pytest.raises(RegistryMisconfigured, match="404 for every schema id"):
        schemas.fetch(REGISTRY, [1, 2])


def test_an_id_of_another_type_is_kept_as_such_and_never_resolved() -> None:
    client, schemas, _ = make()
    client.schemas[5] = Schema("syntax = 'proto3';", "PROTOBUF")
    assert schemas.fetch(REGISTRY, [5]).learned == {5}
    assert schemas.avro(REGISTRY)[5] == NOT_OF_FORMAT
    spec = spec_from_dict(
        {
            "name": "s",
            "topics": ["t"],
            "event_time": "ts",
            "segment_store": "file:///tmp/unused",
            "format": "avro",
            "registry": {"url": REGISTRY.url},
            "schema": {"ts": "timestamp"},
        }
    )
    assert resolvable(spec, schemas.avro(REGISTRY)) == ({}, frozenset({5}))
