"""The embedded servers really run: PostgreSQL (create, connect, restart keeps data) and Kafka."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from ingest_dev.kafka_clients import create_topic, produce_records
from ingest_dev.postgres import LocalPostgres
from ingest_dev.registry import client as registry_client
from ingest_dev.testkit import free_port, wait_until
from tests.fixtures.servers import MakeTopic

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def local_pg() -> Iterator[LocalPostgres]:
    # Always the embedded server, whatever pg_server resolved to: this tests LocalPostgres itself.
    with LocalPostgres() as pg:
        yield pg


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_local_postgres_create_database_and_connect(local_pg: LocalPostgres) -> None:
    assert local_pg.url == f"postgresql://postgres@127.0.0.1:{local_pg.port}/postgres"
    url = local_pg.create_database("app")
    assert url == local_pg.database_url("app")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database(), current_user").fetchone() == ("app", "postgres")
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
        assert conn.execute("SHOW max_connections").fetchone() == ("200",)
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")

    # A template copy carries schema and rows.
    copy_url = local_pg.create_database("app_copy", template="app")
    with psycopg.connect(copy_url) as conn:
        assert conn.execute("SELECT id, v FROM t").fetchall() == [(1, "a")]


def test_template_copy_terminates_sessions_left_on_the_template(local_pg: LocalPostgres) -> None:
    url = local_pg.create_database("busy_template")
    with psycopg.connect(url, autocommit=True) as idle:
        idle.execute("SELECT 1")
        started = time.monotonic()
        local_pg.create_database("from_busy", template="busy_template")
        # Not PostgreSQL's 5 s wait for other sessions to leave: they are terminated up front.
        assert time.monotonic() - started < 2
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    with psycopg.connect(local_pg.database_url("from_busy")) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
def test_local_postgres_restart_keeps_data_and_port(local_pg: LocalPostgres, crash: bool) -> None:
    name = "restart_crash" if crash else "restart_clean"
    url = local_pg.create_database(name)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    port = local_pg.port

    local_pg.restart(crash=crash)

    assert local_pg.port == port
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1000,)


def test_local_postgres_stop_removes_its_temp_dir() -> None:
    pg = LocalPostgres().start()
    base_dir = pg.base_dir
    assert (base_dir / "data" / "PG_VERSION").is_file()
    pg.stop()
    assert not base_dir.exists()
    assert not pg.is_running()


def test_local_postgres_keeps_a_given_base_dir() -> None:
    # Not pytest's tmp_path: as root, the server runs as `postgres`, which cannot traverse
    # /tmp/pytest-of-root (mode 0700).  LocalPostgres chowns only base_dir itself.
    base = Path(tempfile.mkdtemp(prefix="ingest-pg-test-"))
    try:
        with LocalPostgres(base_dir=base) as pg, psycopg.connect(pg.url) as conn:
            conn.execute("CREATE TABLE kept (id int)")
        assert (base / "data" / "PG_VERSION").is_file()
        # The existing cluster is reused, not re-initialised.
        with LocalPostgres(base_dir=base) as pg, psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_produce_and_consume_back(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=6)
    records = [(None, b"key-%d" % (i % 97), b"value-%d" % i) for i in range(1000)]

    log_end = produce_records(kafka_bootstrap, topic, records, timeout=20)

    assert sum(log_end.values()) == 1000
    assert set(log_end) <= set(range(6))
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": "test-embedded",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        # Explicit assignment from offset 0: no group rebalance wait, no watermark use.
        consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
        seen: dict[tuple[bytes | None, bytes | None], int] = {}
        last_offset: dict[int, int] = {}

        def consumed_all() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                seen[(msg.key(), msg.value())] = partition
                last_offset[partition] = max(last_offset.get(partition, -1), offset)
            return len(seen) >= 1000

        wait_until(consumed_all, 15, "the 1000 records", interval=0, detail=lambda: f"{len(seen)} consumed")
    finally:
        consumer.close()

    assert len(seen) == 1000
    assert {value for _, value in seen} == {value for _, _, value in records}
    # Same key -> same partition (the partitioner is deterministic in the key).
    partitions_by_key: dict[bytes | None, set[int]] = {}
    for (key, _), partition in seen.items():
        partitions_by_key.setdefault(key, set()).add(partition)
    assert all(len(ps) == 1 for ps in partitions_by_key.values())
    # Offsets are dense from 0, so the log end is the last consumed offset + 1.
    assert {p: off + 1 for p, off in last_offset.items()} == log_end


def test_produce_to_explicit_partitions(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=3)
    log_end = produce_records(kafka_bootstrap, topic, [(2, None, b"x")] * 5 + [(0, b"k", None)], timeout=20)
    assert log_end == {2: 5, 0: 1}


def test_create_topic_is_idempotent_but_checks_partition_count(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=2)
    create_topic(kafka_bootstrap, topic, 2, timeout=10)
    with pytest.raises(ValueError, match="wanted 3"):
        create_topic(kafka_bootstrap, topic, 3, timeout=10)


@pytest.mark.timeout(240)  # the session's registry may start here (~3-30 s, with the load)
def test_the_demo_avro_data_goes_through_the_registry(schema_registry_url: str) -> None:
    """The demo's default data: two writer versions under ``<topic>-value``, the key's schema
    under ``<topic>-key``, and records any Confluent client decodes through the registry."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from ingest_dev import avro_samples
    from ingest_dev.demo import avro_encoder, sample_record

    topic = "demo-" + uuid.uuid4().hex[:8]
    v1, v2 = avro_samples.writers(schema_registry_url, topic, (avro_samples.CLICK_V1, avro_samples.CLICK_V2))
    key = avro_samples.key_writer(schema_registry_url, topic)
    client = registry_client(schema_registry_url)
    assert client.get_versions(f"{topic}-value") == [1, 2]
    assert client.get_versions(f"{topic}-key") == [1]
    deserialize = AvroDeserializer(client)
    for writer, version in ((v1, 1), (v2, 2)):
        k, value = avro_encoder(writer, key, version)(42)
        assert deserialize(k, SerializationContext(topic, MessageField.KEY)) == {"user": "user-42"}
        record = sample_record(42, version)
        written = {**record, "ts": datetime.fromtimestamp(int(str(record["ts"])) / 1000, tz=UTC)}
        assert deserialize(value, SerializationContext(topic, MessageField.VALUE)) == written
