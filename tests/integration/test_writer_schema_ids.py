"""Writer schema ids a build meets that no writer it has covers, against the real registry,
Kafka and Spark (ingest.builder.writer_schemas): the job names them, they are fetched, and a
served one is decoded by the job run again; an id the registry answers 404 for is waited for
(``SchemaIdsPending``: the build queue builds the split again) and its records are rejects
(``unknown_schema_id``) only once ``wait_s`` has passed since its first 404, never cached; a
URL that answers 404 for every id and never served one is a misconfigured registry."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.kafka_read import KafkaReader
from ingest.builder.writer_schemas import RegistryMisconfigured, SchemaIdsPending, WriterSchemas
from ingest.formats.registry import RegistrySettings, registry_client
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_dev.registry import client as dev_client
from tests.acceptance.test_registry_formats import NEVER_REGISTERED_ID, V1, order, serializer
from tests.fakes import FakeClock, RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_over, values
from tests.protobuf_orders import ORDER_COLUMNS, OrderVersion, framed
from tests.protobuf_orders import order as proto_order


def avro_spec(tmp_path: Path, url: str, **over: Any) -> SourceSpec:
    doc: dict[str, Any] = {
        "name": "orders",
        "topics": ["orders"],
        "event_time": "ts",
        "segment_store": str(tmp_path / "store"),
        "format": "avro",
        "schema": {"id": "long", "ts": "timestamp"},
        "registry": {"url": url},
        **over,
    }
    return spec_from_dict(doc)


def wire(schema_id: int, writer: str, record: dict[str, Any]) -> bytes:
    """``record`` in the Confluent wire format under ``schema_id``, whether or not the registry has it."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(json.loads(writer)), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


def parquet_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "store").rglob("*.parquet"))


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of splits of each Spark job the builds of the test ran (one entry per job)."""
    ran: list[int] = []
    frame = KafkaReader.frame

    def counted(self: KafkaReader, spark: Any, splits: Any) -> Any:
        ran.append(len(splits))
        return frame(self, spark, splits)

    monkeypatch.setattr(KafkaReader, "frame", counted)
    yield ran


def test_an_id_registered_after_a_build_met_it_is_decoded_by_the_next_build(
    spark: Any,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    schema_registry_url: str,
    jobs: list[int],
) -> None:
    """The first build meets an id the registry does not have yet (a producer registers it a
    moment later): its split waits, nothing written. Once registered, the next build's job
    meets the id (no writer has it: the 404 was not kept), fetches it, and runs again with it."""
    client = dev_client(schema_registry_url)
    # Ids are given out in order: the next schema registered gets the one after this one's.
    own = V1.replace('"namespace": "acme"', f'"namespace": "acme.n{uuid.uuid4().hex}"')
    last = client.register_schema(f"ids-{uuid.uuid4().hex}", Schema(own, "AVRO"))
    writer = V1.replace('"namespace": "acme"', f'"namespace": "acme.n{uuid.uuid4().hex}"')
    sid = last + 1
    offsets = produce(
        kafka_bootstrap,
        TopicPartition(make_topic(partitions=1), 0),
        values([wire(sid, writer, order(i)) for i in range(10)]),
    )
    spec = avro_spec(tmp_path, schema_registry_url)
    builder = spark_builder(
        spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=WriterSchemas(wait_s=60, clock=FakeClock())
    )
    [waiting] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(waiting, SchemaIdsPending) and str(sid) in str(waiting), waiting
    assert parquet_files(tmp_path) == []

    registered = client.register_schema(f"ids-{uuid.uuid4().hex}", Schema(writer, "AVRO"))
    assert registered == sid, f"another schema took id {sid} meanwhile: this test needs the registry to itself"
    jobs.clear()
    [built] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(built, BuiltSegment), built
    assert (built.row_count, built.rejects_count) == (10, 0)
    assert jobs == [1, 1]  # the job that met the id, and the one that decoded it


def test_an_id_the_registry_does_not_know_is_waited_for_then_its_records_are_rejects(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1 = serializer(schema_registry_url, V1)
    known = [v1(order(i), ctx) for i in range(5)]
    unknown = [wire(NEVER_REGISTERED_ID, V1, order(i)) for i in range(5, 8)]
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values([*known, *unknown]))
    spec = avro_spec(tmp_path, schema_registry_url)
    clock = FakeClock()
    builder = spark_builder(
        spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=WriterSchemas(wait_s=30, clock=clock)
    )
    for advance in (0, 29.9):  # the first 404, and just before its wait has passed
        clock.advance(advance)
        [waiting] = builder.build_batch([split_over(offsets)], spec)
        assert isinstance(waiting, SchemaIdsPending) and str(NEVER_REGISTERED_ID) in str(waiting), waiting
        assert parquet_files(tmp_path) == []
    clock.advance(0.1)
    [built] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(built, BuiltSegment), built
    assert (built.row_count, built.rejects_count, built.parse_errors) == (5, 3, (("unknown_schema_id", 3),))


def test_a_url_that_answers_404_for_every_id_is_a_misconfigured_registry(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """The registry's server under a path that is not its API (a base URL without Apicurio's
    /apis/ccompat/v7, say): every id 404s. Past the wait, the worker stops with one line instead
    of rejecting the whole stream."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1 = serializer(schema_registry_url, V1)
    offsets = produce(
        kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values([v1(order(i), ctx) for i in range(5)])
    )
    spec = avro_spec(tmp_path, f"{schema_registry_url}/not-the-api")
    clock = FakeClock()
    builder = spark_builder(
        spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=WriterSchemas(wait_s=10, clock=clock)
    )
    [waiting] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(waiting, SchemaIdsPending), waiting
    clock.advance(10)
    [stopped] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(stopped, RegistryMisconfigured), stopped
    assert "answered 404 for every schema id" in str(stopped)
    assert parquet_files(tmp_path) == []


class Follower:
    """The registry's clients as a follower that has not replicated some schemas yet: asked for
    one in ``lag`` (an id of ``get_schema``, a (subject, version) of ``get_version``) it
    answers 404, until :meth:`catch_up` (``once``: until it answered 404 for it once). The
    registry itself cannot be made to answer so: it refuses a schema whose reference it does
    not have (422) and the deletion of a referenced version (42206)."""

    def __init__(self, *lag: object, once: bool = False) -> None:
        self.lag = set(lag)
        self.once = once
        self.answered_404: list[object] = []

    def catch_up(self) -> None:
        self.lag.clear()

    def _missing(self, key: object) -> None:
        if key in self.lag:
            self.answered_404.append(key)
            if self.once:
                self.lag.discard(key)
            raise SchemaRegistryError(404, 40403, f"{key} not found (not replicated yet)")

    def client(self, settings: RegistrySettings) -> Any:
        real = registry_client(settings)
        follower = self

        class Client:
            def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Any:
                follower._missing(schema_id)
                return real.get_schema(schema_id, *args, **kwargs)

            def get_version(self, subject: str, version: int, *args: Any, **kwargs: Any) -> Any:
                follower._missing((subject, version))
                return real.get_version(subject, version, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        return Client()


def test_an_id_served_while_its_build_ran_is_built_again_not_rejected(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """The registry answers 404 for the id the job met, and serves it a moment later, before the
    build has finished: the job decoded none of its records, and they are not rejects: the
    split is built again, with the writer."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1 = serializer(schema_registry_url, V1)
    records = [v1(order(i), ctx) for i in range(5)]
    sid = int.from_bytes(records[0][1:5], "big")
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values(records))
    registry = Follower(sid, once=True)
    schemas = WriterSchemas(registry.client, wait_s=60, clock=FakeClock())
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=schemas)
    spec = avro_spec(tmp_path, schema_registry_url)
    [again] = builder.build_batch([split_over(offsets)], spec)
    assert registry.answered_404 == [sid]
    assert isinstance(again, SchemaIdsPending) and str(sid) in str(again), again
    assert parquet_files(tmp_path) == []
    [built] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(built, BuiltSegment), built
    assert (built.row_count, built.rejects_count) == (5, 0)


def test_a_protobuf_import_the_registry_answers_404_for_is_not_kept_and_resolves_later(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="pb")
    v1 = OrderVersion.make(1)
    encode: Callable[[Any], bytes] = framed(
        schema_registry_url, v1.Order, SerializationContext(topic, MessageField.VALUE)
    )
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), values([encode(proto_order(v1, i)) for i in range(6)]))
    spec = spec_from_dict(
        {
            "name": "orders",
            "topics": [topic],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "protobuf",
            "schema": ORDER_COLUMNS,
            "registry": {"url": schema_registry_url},
        }
    )
    # The writer's import (registered as a reference by the serializer) not replicated yet.
    registry = Follower(("acme/customer.proto", 1))
    schemas = WriterSchemas(registry.client, wait_s=60, clock=FakeClock())
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar(), writer_schemas=schemas)
    [waiting] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(waiting, SchemaIdsPending), waiting
    assert registry.answered_404 and set(registry.answered_404) == {("acme/customer.proto", 1)}
    assert parquet_files(tmp_path) == []
    registry.catch_up()
    [built] = builder.build_batch([split_over(offsets)], spec)
    assert isinstance(built, BuiltSegment), built
    assert (built.row_count, built.rejects_count) == (6, 0)
