"""Avro schema evolution through to the Iceberg table, against the real registry, Kafka, Spark
and PostgreSQL: one topic written with three writer schema versions, a schema id deleted from
the registry after producing, a writer the reader cannot resolve and bodies that do not decode.
Each bad record is a reject with its reason; the writers evolve before the reader, the reader
adopts a version on ``source apply`` and its new column reaches later segments and the table;
changes earlier segments could not follow are refused at apply in one line. Exactly once is
checked from the Parquet files and from the table (read back with pyiceberg)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.job import BuilderFactory
from ingest.errors import ConfigError
from ingest.table.catalog import MetastoreCatalog, identifier
from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_dev.registry import LocalSchemaRegistry
from ingest_dev.registry import client as registry_client
from metastore import Metastore
from metastore.tables import TableKind
from tests.acceptance.harness import Produced, StartWorker, apply_spec, assert_exactly_once, process_env
from tests.acceptance.test_cli import assert_one_line_error, ingest
from tests.acceptance.test_registry_formats import (
    V1,
    V2,
    V3,
    order,
    order_schema,
    published,
    run_to_end,
    write_registry_spec,
)
from tests.fixtures.servers import MakeTopic

PARTITIONS = 3


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalSchemaRegistry]:
    """A registry of this test's own, whose ids disappear with a permanent delete as Confluent's
    do: Apicurio keeps a deleted schema's content reachable by its content id, so its ids here
    are global ids (legacy id mode), which the delete removes."""
    with LocalSchemaRegistry(
        base_dir=tmp_path / "registry", overrides={"apicurio.ccompat.legacy-id-mode.enabled": "true"}
    ) as reg:
        yield reg


def serializer(url: str, schema: str, subject: str | None = None) -> AvroSerializer:
    conf: dict[str, Any] = {"auto.register.schemas": True}
    if subject is not None:
        conf["subject.name.strategy"] = lambda _ctx, _name: subject
    return AvroSerializer(registry_client(url), schema, conf=conf)


def table_rows(database_url: str, source: str) -> tuple[list[str], list[dict[str, Any]]]:
    catalog = MetastoreCatalog(database_url)
    try:
        table = catalog.load_table(identifier(source, TableKind.DATA))
        columns = table.schema().column_names
        return columns, table.scan().to_arrow().to_pylist()
    finally:
        catalog.close()


def commit_table(database_url: str, source: str) -> None:
    with TableCommitter(database_url, source, CommitSettings(batch_segments=100, interval_s=0)) as committer:
        committer.commit_all()


def test_three_writer_versions_a_deleted_id_and_a_reader_that_evolves_land_exactly_once_in_the_table(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    registry: LocalSchemaRegistry,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    url = registry.url
    topic = make_topic(partitions=PARTITIONS)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produced = Produced(kafka_bootstrap, topic, PARTITIONS)
    v1 = serializer(url, V1)
    produced.produce(150, lambda i: v1(order(i), ctx))
    # The reader is the latest version when applied: v1.
    source, spec_path = write_registry_spec(tmp_path, topic, url, 'format = "avro"\nschema_from = "registry"\n')
    apply_spec(database_url, spec_path)
    enable_table(database_url, source, PartitionBy.NONE, RejectsMode.NONE)

    # Writers move on before the reader: v2 adds region (default "eu"), which reader v1 drops.
    v2 = serializer(url, V2)
    produced.produce(150, lambda i: v2({**order(i), "region": "us"}, ctx))
    gone_schema = V1.replace('"Order"', '"Gone"')
    gone = serializer(url, gone_schema, subject=f"{topic}-gone-value")
    # amount written as a string: no reader here can resolve it (subject of its own: a registry
    # checking compatibility on the topic's subject would refuse it there).
    wrong = serializer(url, V1.replace('"amount", "type": "double"', '"amount", "type": "string"'), f"{topic}-w")
    framed = v2({**order(0), "region": "us"}, ctx)
    assert framed is not None
    header = framed[:5]
    bad: dict[str, list[Callable[[int], bytes | None]]] = {
        "unknown_schema_id": [lambda i: gone(order(i), ctx)] * 4,
        "unresolvable_writer_schema": [lambda i: wrong({**order(i), "amount": "1.5"}, ctx)] * 4,
        # A long, then a string whose length is past the end of the body.
        "undecodable": [lambda i: header + b"\x02", lambda i: header + b"\x02\x40"],
        "not_confluent_framed": [lambda i: b'{"id": 1}'],
    }
    makers = [make for makers in bad.values() for make in makers]
    first_bad = produced.next_id
    produced.produce(len(makers), lambda i: makers[i - first_bad](i))
    gone_id = registry_client(url).get_latest_version(f"{topic}-gone-value").schema_id
    client = registry_client(url)
    client.delete_subject(f"{topic}-gone-value")
    client.delete_subject(f"{topic}-gone-value", permanent=True)
    with pytest.raises(SchemaRegistryError) as unknown:
        registry_client(url).get_schema(gone_id)
    assert unknown.value.http_status_code == 404

    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)
    commit_table(database_url, source)
    columns, _ = table_rows(database_url, source)
    assert "region" not in columns and "amount" in columns

    # The reader adopts v2 on apply: region becomes a column of later segments and of the table.
    apply_spec(database_url, spec_path)
    v3 = serializer(url, V3)
    produced.produce(150, lambda i: v3({**order(i), "region": "ap", "tags": ["x"]}, ctx))
    produced.produce(60, lambda i: v1(order(i), ctx))  # an old producer: region's default
    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)
    commit_table(database_url, source)

    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (510, len(makers))
    data, rejects = published(database_url, source)
    assert Counter(rejects["_error"].to_pylist()) == Counter({r: len(m) for r, m in bad.items()})
    assert Counter(data["region"].to_pylist()) == Counter({None: 300, "ap": 150, "eu": 60})
    with Metastore(database_url) as store:
        versions = {s["spec_version"] for s in store.segments(source)}
    assert versions == {1, 2}

    columns, rows = table_rows(database_url, source)
    assert "region" in columns and "tags" not in columns
    in_table = Counter((r["_partition"], r["_offset"]) for r in rows)
    assert max(in_table.values()) == 1, "a record is in the table twice"
    assert set(in_table) == set(zip(data["_partition"].to_pylist(), data["_offset"].to_pylist(), strict=True))
    assert Counter(r["region"] for r in rows) == Counter({None: 300, "ap": 150, "eu": 60})

    # A registry version adding a field without a default cannot read what was written so far.
    v4 = order_schema(*json.loads(V3)["fields"][4:], {"name": "country", "type": "string"})
    serializer(url, v4)({**order(1), "region": "ap", "tags": [], "country": "fr"}, ctx)
    refused = ingest(process_env(database_url, kafka_bootstrap), "source", "apply", str(spec_path))
    assert_one_line_error(refused, 2, f"source {source}: refused against version 2", "field 'country'")
    # A column whose type changes: earlier segments and the table could not be read as one schema.
    spec_path.write_text(
        spec_path.read_text().replace('schema_from = "registry"\n', '[schema]\nts = "timestamp"\nregion = "long"\n')
    )
    with pytest.raises(ConfigError) as changed:
        apply_spec(database_url, spec_path)
    assert "column 'region' changes type from string to long" in str(changed.value)
    with Metastore(database_url) as store:
        assert store.latest_spec(source)[0] == 2
