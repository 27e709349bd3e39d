"""An Avro build while the schema registry is down, against a real registry and Spark: a schema
fetched before keeps decoding; a split holding a schema never fetched is not built
(RegistryUnavailable: the pipeline makes it wait), rejecting and skipping nothing, and the
same split builds once the registry is back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.build.builder import SparkSegmentBuilder
from ingest.build.writer_schemas import RegistryUnavailable
from ingest.spec import spec_from_dict
from ingest_common.model import BuiltSegment
from ingest_dev.registry import LocalSchemaRegistry
from tests.acceptance.test_registry_formats import V1, V2, order, serializer
from tests.fakes import RecordingRegistrar
from tests.integration.test_builder import split_of


def test_a_registry_outage_fails_the_build_and_rejects_nothing(
    spark: Any, tmp_path: Path, private_schema_registry: LocalSchemaRegistry
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
    builder = SparkSegmentBuilder(spark, RecordingRegistrar())
    first = builder.build(split_of(old), spec)
    assert (first.row_count, first.rejects_count) == (20, 0)

    registry.halt()
    # v1 was fetched by the first build: it decodes through the outage.
    cached = builder.build(split_of(old, start=200), spec)
    assert (cached.row_count, cached.rejects_count) == (20, 0)
    mixed = split_of([*old, *new], start=300)
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
