"""Formats behind a schema registry, end to end against the real registry, Kafka, Spark and
PostgreSQL: Avro in the Confluent wire format written with several writer schema versions,
JSON Schema framing, and bad input (wrong framing, an id the registry never had, a body that
does not decode), each a reject with its own reason."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.job import BuilderFactory
from ingest.segments import store as segment_store
from ingest_dev.registry import client as registry_client
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    Produced,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    settings,
)
from tests.fixtures.servers import MakeTopic

PARTITIONS = 3
# An id no registry here ever gave out (ids are small and increasing).
NEVER_REGISTERED_ID = 2**31 - 7


def order_schema(*extra: dict[str, Any]) -> str:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": "double"},
        *extra,
    ]
    return json.dumps({"type": "record", "name": "Order", "namespace": "acme", "fields": fields})


V1 = order_schema()
V2 = order_schema({"name": "region", "type": "string", "default": "eu"})
V3 = order_schema(
    {"name": "region", "type": "string", "default": "eu"},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
)


def order(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"user-{i % 7}", "ts": datetime(2026, 11, 25, 10, 0, i % 60, tzinfo=UTC), "amount": i / 2}


def serializer(registry_url: str, schema: str) -> AvroSerializer:
    return AvroSerializer(registry_client(registry_url), schema, conf={"auto.register.schemas": True})


def published(database_url: str, source: str) -> tuple[pa.Table, pa.Table]:
    """The published data rows and rejects of a source."""
    data, rejects = [], []
    with Metastore(database_url) as store:
        for seg in store.segments(source):
            for uri in seg["files"]:
                fs, path = segment_store.filesystem(uri)
                data.append(pq.read_table(path, filesystem=fs))
            for uri in seg["rejects_files"]:
                fs, path = segment_store.filesystem(uri)
                rejects.append(pq.read_table(path, filesystem=fs, columns=["_value", "_error"]))
    no_rejects = pa.table({"_value": pa.array([], pa.binary()), "_error": pa.array([], pa.string())})
    return pa.concat_tables(data, promote_options="default"), pa.concat_tables(rejects or [no_rejects])


def write_registry_spec(tmp_path: Path, topic: str, registry_url: str, body: str) -> tuple[str, Path]:
    name = "s" + uuid.uuid4().hex[:8]
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\ntopics = ["{topic}"]\nevent_time = "ts"\nsegment_store = "{tmp_path / "store"}"\n'
        f'{body}\n[split]\nmax_records = 400\nmax_age = "1s"\n\n[registry]\nurl = "{registry_url}"\n'
    )
    return name, path


def run_to_end(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    start_worker: StartWorker,
    spark_builder: BuilderFactory,
    source: str,
    produced: Produced,
) -> None:
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 240, "the worker to catch up")
    worker.stop()
    assert worker.error is None


def test_avro_with_three_writer_versions_and_bad_records_lands_exactly_once(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    schema_registry_url: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produced = Produced(kafka_bootstrap, topic, PARTITIONS)
    v1, v2, v3 = (serializer(schema_registry_url, s) for s in (V1, V2, V3))
    produced.produce(300, lambda i: v1(order(i), ctx))
    produced.produce(300, lambda i: v2({**order(i), "region": "us"}, ctx))
    produced.produce(300, lambda i: v3({**order(i), "region": "ap", "tags": ["x", str(i % 3)]}, ctx))
    good_v1 = v1(order(0), ctx)
    assert good_v1 is not None
    v1_header = good_v1[:5]
    bad = {
        "not_confluent_framed": [b"\x01" + good_v1[1:], b"\x00\x00", b'{"id": 1}'],
        "unknown_schema_id": [b"\x00" + NEVER_REGISTERED_ID.to_bytes(4, "big") + good_v1[5:]],
        # A long, then a string whose length is past the end of the body.
        "undecodable": [v1_header + b"\x02", v1_header + b"\x02\x40"],
        "null_value": [None],
    }
    bad_values = [(reason, value) for reason, values in bad.items() for value in values]
    produced.produce(len(bad_values), lambda i: bad_values[i - 900][1])
    # The latest version (v3) is the reader schema, fixed when the spec is applied.
    source, spec_path = write_registry_spec(
        tmp_path, topic, schema_registry_url, 'format = "avro"\nschema_from = "registry"\n'
    )
    apply_spec(database_url, spec_path)

    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)

    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (900, len(bad_values))
    data, rejects = published(database_url, source)
    assert Counter(rejects["_error"].to_pylist()) == Counter({r: len(v) for r, v in bad.items()})
    by_version: dict[str, Counter[str]] = {}
    for row in data.to_pylist():
        tags = tuple(row["tags"])
        version = {"eu": "v1", "us": "v2", "ap": "v3"}[row["region"]]
        by_version.setdefault(version, Counter())[f"tags={tags!r}"] += 1
    # v1's records get the reader's defaults for the two fields it did not have.
    assert by_version["v1"] == Counter({"tags=()": 300})
    assert by_version["v2"] == Counter({"tags=()": 300})
    assert sum(by_version["v3"].values()) == 300 and "tags=()" not in by_version["v3"]
    assert data.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert {r["ts"].second for r in data.to_pylist()} == set(range(60))


def test_avro_with_the_spec_schema_reads_every_writer(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    schema_registry_url: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produced = Produced(kafka_bootstrap, topic, PARTITIONS)
    micros = order_schema().replace("timestamp-millis", "timestamp-micros").replace('"Order"', '"OrderMicros"')
    v1, v2, vm = (serializer(schema_registry_url, s) for s in (V1, V2, micros))
    produced.produce(100, lambda i: v1(order(i), ctx))
    produced.produce(100, lambda i: v2({**order(i), "region": "us"}, ctx))
    produced.produce(100, lambda i: vm(order(i), ctx))
    source, spec_path = write_registry_spec(
        tmp_path,
        topic,
        schema_registry_url,
        'format = "avro"\n[schema]\nid = "long"\nts = "timestamp"\nregion = "string"\namount = "double"\n',
    )
    apply_spec(database_url, spec_path)

    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)

    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (300, 0)
    data, _ = published(database_url, source)
    regions = Counter(data["region"].to_pylist())
    # No default in a spec's schema: a writer without the field gives null.
    assert regions == Counter({None: 200, "us": 100})
    # Millis and micros writers give the same instants.
    assert Counter(r.second for r in data["ts"].to_pylist()) == Counter({s: 5 for s in range(60)})


def test_json_schema_framing_then_the_json_path(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    schema_registry_url: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    produced = Produced(kafka_bootstrap, topic, PARTITIONS)
    header = b"\x00" + (17).to_bytes(4, "big")

    def body(i: int) -> bytes:
        return json.dumps({"id": i, "ts": f"2026-11-25T10:00:{i % 60:02d}Z", "user": f"u{i}"}).encode()

    produced.produce(500, lambda i: header + body(i))
    bad = [body(1), b"\x00\x00", header + b"{not json", header + b'{"id": "x", "ts": "2026-11-25T10:00:00Z"}']
    produced.produce(len(bad), lambda i: bad[i - 500])
    source, spec_path = write_registry_spec(
        tmp_path, topic, schema_registry_url, 'format = "json_schema"\n[schema]\nid = "long"\nts = "timestamp"\n'
    )
    apply_spec(database_url, spec_path)

    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)

    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (500, 4)
    data, rejects = published(database_url, source)
    assert sorted(data["id"].to_pylist()) == list(range(500))
    assert Counter(rejects["_error"].to_pylist()) == Counter(
        {"not_confluent_framed": 2, "invalid_json": 1, "type_mismatch": 1}
    )
