"""An Avro build while the schema registry is down, against a real registry, Kafka and Spark: a
schema fetched before keeps decoding; a split holding a schema never fetched is not built
(RegistryUnavailable: the build queue makes it wait), rejecting and skipping nothing, and the
same split builds once the registry is back. Writer schemas the reader cannot resolve are
rejects, never a failed build; timestamps are read in their writer's precision."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.writer_schemas import RegistryUnavailable
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_dev.registry import LocalSchemaRegistry
from ingest_dev.registry import client as registry_client
from tests.acceptance.test_registry_formats import V1, V2, order, serializer
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_of, split_over, values


def test_a_registry_outage_fails_the_build_and_rejects_nothing(
    spark: Any,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    private_schema_registry: LocalSchemaRegistry,
) -> None:
    registry = private_schema_registry
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1, v2 = serializer(registry.url, V1), serializer(registry.url, V2)
    old = [v1(order(i), ctx) for i in range(20)]
    new = [v2({**order(i), "region": "us"}, ctx) for i in range(20, 40)]
    spec = spec_from_dict(
        {
            "name": "orders",
            "topics": ["orders"],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "avro",
            "schema": {"id": "long", "ts": "timestamp", "region": "string"},
            "registry": {"url": registry.url},
        }
    )
    # The old records, then the new: [0, 20) holds v1's, [0, 40) both writers'.
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values([*old, *new]))
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    first = builder.build(split_of(offsets.tp, 0, 20), spec)
    assert (first.row_count, first.rejects_count) == (20, 0)

    registry.halt()
    # v1 was fetched by the first build: it decodes through the outage.
    cached = builder.build(split_of(offsets.tp, 0, 20), spec)
    assert (cached.row_count, cached.rejects_count) == (20, 0)
    mixed = split_over(offsets)
    files_before = sorted((tmp_path / "store").rglob("*.parquet"))
    [result] = builder.build_batch([mixed], spec)
    assert isinstance(result, RegistryUnavailable), result
    assert "did not answer" in str(result)
    # Nothing written, no reject file: the failed build left the store as it was.
    assert sorted((tmp_path / "store").rglob("*.parquet")) == files_before

    registry.start()
    [again] = builder.build_batch([mixed], spec)
    assert isinstance(again, BuiltSegment), again
    assert (again.row_count, again.rejects_count, again.skipped_count) == (40, 0, 0)


def test_writers_the_reader_cannot_resolve_are_rejects_not_a_failed_build(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """Checked per writer id before the job: a field whose type changed incompatibly (spec's
    reader), and a reader field without default that the writer lacks (registry's reader)."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1 = serializer(schema_registry_url, V1)
    # Registered under a subject of its own: a registry enforcing compatibility on the orders
    # subject would refuse it, a producer using another subject gets it through.
    wrong = V1.replace('"name": "amount", "type": "double"', '"name": "amount", "type": "string"')
    assert wrong != V1
    bad = AvroSerializer(
        registry_client(schema_registry_url),
        wrong,
        conf={"auto.register.schemas": True, "subject.name.strategy": lambda _ctx, _name: "orders-wrong-value"},
    )
    good = [v1(order(i), ctx) for i in range(30)]
    strings = [bad({**order(i), "amount": "12.5"}, ctx) for i in range(30, 40)]
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), values([*good, *strings]))
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    doc: dict[str, Any] = {
        "name": "orders",
        "topics": ["orders"],
        "event_time": "ts",
        "segment_store": str(tmp_path / "store"),
        "format": "avro",
        "schema": {"id": "long", "ts": "timestamp", "amount": "double"},
        "registry": {"url": schema_registry_url},
    }
    spec = spec_from_dict(doc)
    built = builder.build(split_over(offsets), spec)
    assert (built.row_count, built.rejects_count) == (30, 10)
    assert built.parse_errors == (("unresolvable_writer_schema", 10),)

    # A registry reader (schema_from = "registry") with a field no writer here has, no default.
    reader = V1.replace("]}", ', {"name": "region", "type": "string"}]}')
    registry_spec = replace(
        spec, schema_from="registry", schema=(*spec.schema, ("region", "string")), reader_schema=reader
    )
    built = builder.build(split_over(offsets), registry_spec)
    assert (built.row_count, built.rejects_count) == (0, 40)
    assert built.parse_errors == (("unresolvable_writer_schema", 40),)


def test_a_registry_reader_reads_each_timestamp_in_its_writer_precision(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """A registry's reader in micros and a writer in millis: Avro resolves long to long, so
    without following the writer the instants would come out 1000 times too late."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    records = [order(i) for i in range(12)]
    encoded = [serializer(schema_registry_url, V1)(r, ctx) for r in records]
    micros_reader = V1.replace("timestamp-millis", "timestamp-micros")
    spec = spec_from_dict(
        {
            "name": "orders",
            "topics": ["orders"],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "format": "avro",
            "schema": {"id": "long", "ts": "timestamp"},
            "registry": {"url": schema_registry_url},
        }
    )
    spec = replace(spec, schema_from="registry", reader_schema=micros_reader)
    offsets = produce(kafka_bootstrap, TopicPartition(make_topic(partitions=1), 0), [(None, v) for v in encoded])
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (built.row_count, built.rejects_count) == (12, 0)
    rows = pq.read_table([f.removeprefix("file://") for f in built.files], columns=["id", "ts"]).to_pylist()
    assert {r["id"]: r["ts"] for r in rows} == {r["id"]: r["ts"] for r in records}
