"""What only a real Apache Kafka broker can show: group offsets for Kafka's own tools,
partition growth, transactional and compacted input, and a broker restart mid-ingest.
Every test checks exactly-once from the published Parquet files."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

from ingest.builder.job import BuilderFactory
from ingest.consume.kafka import ConfluentConsumer
from ingest.ops.status import source_status
from ingest_common.model import TopicPartition
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic, end_offsets
from ingest_dev.testkit import wait_until
from ingest_dev.verify import verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import (
    NewSource,
    Produced,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    sample_value,
    settings,
    write_spec,
)
from tests.fixtures.servers import MakeTopic


def _positions(url: str, source: str) -> dict[int, int | None]:
    with Metastore(url) as store:
        return {int(r["partition"]): r["next_offset"] for r in store.partitions(source)}


def _group_offsets(bootstrap: str, group: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def topic_configs_setter(bootstrap: str, topic: str) -> Callable[..., None]:
    """``set_configs(cleanup_policy="compact", ...)``: incremental topic config changes (``_`` for ``.``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def set_configs(**configs: str) -> None:
        entries = [
            ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
        ]
        resource = ConfigResource("topic", topic, incremental_configs=entries)
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    return set_configs


def _counter(worker: Any, name: str, *labels: str) -> float:
    value: Any = getattr(worker.worker.metrics, name).labels(worker.worker.source, *labels)._value.get()
    return float(value)


def test_published_offsets_reach_the_consumer_group_for_kafkas_own_tools(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(4, max_records=2000, max_age="500ms")
    produced.produce(12_000)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up")
    # The group's committed offsets follow the metastore (asynchronously, within a second or so).
    wait_until(
        lambda: _group_offsets(kafka_bootstrap, f"ingest-{source}") == _positions(database_url, source),
        30,
        "the group's committed offsets to equal next_offset",
    )
    assert _group_offsets(kafka_bootstrap, f"ingest-{source}") == produced.ends
    worker.stop()
    assert worker.error is None
    assert_exactly_once(database_url, source, produced)
    assert _counter(worker, "group_commits", "ok") > 0 and _counter(worker, "group_commits", "failed") == 0


def test_group_commits_that_fail_never_stop_ingestion(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every commit names a topic that does not exist: the broker refuses each one."""
    real = ConfluentConsumer.commit

    def commit_to_a_missing_topic(self: ConfluentConsumer, offsets: Mapping[TopicPartition, int]) -> None:
        real(self, {TopicPartition(tp.topic + "-missing", tp.partition): o for tp, o in offsets.items()})

    monkeypatch.setattr(ConfluentConsumer, "commit", commit_to_a_missing_topic)
    source, produced = new_source(2, max_records=1000, max_age="500ms")
    produced.produce(4000)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up")
        wait_until(lambda: _counter(worker, "group_commits", "failed") > 0, 30, "a refused commit")
        produced.produce(2000)  # still ingesting after the refusals
        wait_until(lambda: produced.caught_up(store, source), 120, "the worker to catch up again")
    worker.stop()
    assert worker.error is None
    assert _counter(worker, "group_commits", "ok") == 0
    assert _group_offsets(kafka_bootstrap, f"ingest-{source}") == {}
    assert_exactly_once(database_url, source, produced)


def test_partitions_added_while_workers_run_are_read_from_earliest(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=2)
    source, spec_path = write_spec(tmp_path, topic, max_records=1000, max_age="500ms")
    apply_spec(database_url, spec_path)
    cfg = settings(
        database_url,
        kafka_bootstrap,
        kafka_properties={
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "500",
            "topic.metadata.refresh.interval.ms": "1000",
        },
    )
    worker = start_worker(cfg, source, spark_builder)
    wait_until(lambda: len(worker.worker.assignment) == 2, 60, "the worker to own both partitions")
    produced = Produced(kafka_bootstrap, topic, 2)
    produced.produce(2000)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 120, "the first two partitions")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=30)
    grown = Produced(kafka_bootstrap, topic, 4)
    grown.ends = dict(produced.ends) | {2: 0, 3: 0}
    grown.next_id = produced.next_id
    grown.produce(4000)  # right away: before the worker has seen the new partitions
    with Metastore(database_url) as store:
        wait_until(lambda: grown.caught_up(store, source), 120, "the new partitions to be read")
    worker.stop()
    assert worker.error is None
    assert (
        len(worker.worker.assignment) == 0
        and worker.worker.metrics.rebalances.labels(source, "assign")._value.get() >= 2
    )  # the new partitions came by a rebalance, not a restart
    # The new partitions' rows were created by the claim (the worker registered two at start),
    # and every record was read from offset 0 (the ranges start there).
    assert_exactly_once(database_url, source, grown)


def _produce_transactions(bootstrap: str, topic: str, plan: list[tuple[bool, int]]) -> dict[int, list[int]]:
    """Each (commit, n) writes n records to every partition of a 2-partition topic in one
    transaction, then commits or aborts it. Returns the offsets of committed records."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    producer.init_transactions(30)
    committed: dict[int, list[int]] = {0: [], 1: []}
    next_id = 0
    for commit, n in plan:
        delivered: list[tuple[int, int]] = []

        def on_delivery(err: Any, msg: Any, out: list[tuple[int, int]] = delivered) -> None:
            assert err is None, err
            out.append((msg.partition(), msg.offset()))

        producer.begin_transaction()
        for _ in range(n):
            for partition in (0, 1):
                producer.produce(
                    topic,
                    value=sample_value(next_id),
                    key=str(next_id).encode(),
                    partition=partition,
                    on_delivery=on_delivery,
                )
                next_id += 1
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
            for partition, offset in delivered:
                committed[partition].append(offset)
        else:
            producer.abort_transaction(30)
    return committed


def test_transactional_input_publishes_committed_records_and_covers_markers_and_aborted_offsets(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=2)
    source, spec_path = write_spec(tmp_path, topic, max_records=700, max_age="500ms")
    apply_spec(database_url, spec_path)
    # Committed, aborted, committed: offsets hold commit/abort markers and aborted records,
    # and the log ends with a commit marker that no read_committed consumer ever receives.
    committed = _produce_transactions(kafka_bootstrap, topic, [(True, 1000), (False, 500), (True, 800)])
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    ends = end_offsets(kafka_bootstrap, topic)
    assert all(ends[p] > max(committed[p]) + 1 for p in (0, 1)), (ends, "the log must end past the last record")
    wait_until(
        lambda: _positions(database_url, source) == ends,
        120,
        "next_offset to reach Kafka's end offsets (past the last commit marker)",
    )
    # A second round after the worker caught up: the tail is covered again.
    more = _produce_transactions(kafka_bootstrap, topic, [(False, 100), (True, 300)])
    ends = end_offsets(kafka_bootstrap, topic)
    wait_until(lambda: _positions(database_url, source) == ends, 120, "next_offset to reach the new end offsets")
    worker.stop()
    assert worker.error is None
    expected = {(topic, p): committed[p] + more[p] for p in (0, 1)}
    with Metastore(database_url) as store:
        result = verify_exactly_once(store, source, expected, log_ends={(topic, p): ends[p] for p in (0, 1)})
        assert not store.gaps(source)  # markers and aborted records are not lost records
        status = source_status(store, settings(database_url, kafka_bootstrap), source)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    assert result.rows == 2 * (1000 + 800 + 300)  # committed records only
    assert status["total_lag"] == 0 and status["detailed_state"] != "STUCK_PARTITIONS"


def test_a_compacted_topic_tiles_its_offset_holes(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = f"compacted-{tmp_path.name[-8:]}".replace("_", "-")
    create_topic(kafka_bootstrap, topic, 1)
    set_configs = topic_configs_setter(kafka_bootstrap, topic)

    # Small, quickly rolled segments that the cleaner compacts as soon as it may.
    set_configs(
        cleanup_policy="compact",
        segment_ms="100",
        min_cleanable_dirty_ratio="0.001",
        min_compaction_lag_ms="0",
        delete_retention_ms="0",
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for batch in range(10):  # 20 keys rewritten 30 times, in batches that roll segments
        for i in range(60):
            n = batch * 60 + i
            producer.produce(topic, key=f"k{n % 20}".encode(), value=sample_value(n), partition=0)
        producer.flush(30)
        time.sleep(0.3)

    def surviving() -> list[int]:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": "probe",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        offsets: list[int] = []

        def at_the_end() -> bool:
            msg = consumer.poll(1.0)
            if msg is None:
                return False
            if msg.error() is not None:
                return True  # end of partition
            offsets.append(int(msg.offset()))
            return False

        try:
            # Bounded: past it, the offsets read so far.
            with contextlib.suppress(TimeoutError):
                wait_until(at_the_end, 20, "the end of the compacted partition", interval=0)
        finally:
            consumer.close()
        return offsets

    wait_until(lambda: len(surviving()) < 400, 90, "the log cleaner to compact the topic", interval=2)
    # Freeze the log (no further cleaning) so the expected offsets stay true while the worker reads.
    set_configs(cleanup_policy="delete", retention_ms="-1")
    time.sleep(2)  # a cleaning pass that was already running finishes
    offsets = surviving()
    end = end_offsets(kafka_bootstrap, topic)[0]
    holes = end - len(offsets)
    assert holes > 100, f"compaction left {len(offsets)} of {end} offsets"

    source, spec_path = write_spec(tmp_path, topic, max_records=50, max_age="500ms")
    apply_spec(database_url, spec_path)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    wait_until(lambda: _positions(database_url, source) == {0: end}, 120, "the worker to reach the log end")
    worker.stop()
    assert worker.error is None
    with Metastore(database_url) as store:
        result = verify_exactly_once(store, source, {(topic, 0): offsets}, log_ends={(topic, 0): end})
        assert not store.gaps(source)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    assert result.rows == len(offsets)


def test_a_broker_restart_mid_ingest_loses_and_duplicates_nothing(
    tmp_path: Path,
    database_url: str,
    private_kafka: LocalKafka,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    bootstrap = private_kafka.bootstrap
    topic = "restart"
    create_topic(bootstrap, topic, 4)
    source, spec_path = write_spec(tmp_path, topic, max_records=1000, max_age="500ms")
    apply_spec(database_url, spec_path)
    produced = Produced(bootstrap, topic, 4)
    produced.produce(8000)
    cfg = settings(database_url, bootstrap)
    worker = start_worker(cfg, source, spark_builder)
    wait_until(lambda: sum(v or 0 for v in _positions(database_url, source).values()) > 0, 120, "a first publish")

    # The broker goes down (controlled shutdown) for 8 s while the worker is mid-ingest.
    private_kafka.halt()
    with Metastore(database_url) as store:
        during = source_status(store, cfg, source)["detailed_state"]
    time.sleep(8)
    private_kafka.start()
    produced.produce(8000)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up after the restart")
        after = source_status(store, cfg, source)["detailed_state"]
    worker.stop()
    assert worker.error is None
    assert (during, after) == ("UNABLE_TO_CONNECT_TO_STREAM", "CAUGHT_UP")  # status shows the outage while it lasts
    assert_exactly_once(database_url, source, produced)
