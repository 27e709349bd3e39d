"""Retention gaps: the stored offset is below the partition's earliest offset.

Against the real broker, the start of partition 0 leaves the log while the workers are
stopped, in the two ways it happens in production: an operator's ``delete_records``, and
time-based retention deleting rolled segments of a topic with a tiny ``retention.ms``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from ingest.builder.job import BuilderFactory
from ingest.cli import main as cli_main
from ingest.config import Settings
from ingest.ops.status import source_status
from ingest_dev.kafka_clients import produce_records
from ingest_dev.testkit import wait_until
from ingest_dev.verify import read_coordinates, verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import StartWorker, apply_spec, sample_value, settings, write_spec
from tests.acceptance.test_apache_kafka import topic_configs_setter
from tests.fixtures.servers import MakeTopic

PARTITIONS = 4


def _produce(bootstrap: str, topic: str, records: list[tuple[int, int]]) -> None:
    """Produce (partition, id) records, every one delivered."""
    produce_records(bootstrap, topic, ((p, str(i).encode(), sample_value(i)) for p, i in records))


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "log_level": 3})
    try:
        low, high = consumer.get_watermark_offsets(KafkaTopicPartition(topic, partition), timeout=10, cached=False)
        return int(low), int(high)
    finally:
        consumer.close()


def _published(url: str, source: str) -> Counter[tuple[int, int]]:
    seen: Counter[tuple[int, int]] = Counter()
    with Metastore(url) as store:
        for seg in store.segments(source):
            for uri in list(seg["files"]) + list(seg["rejects_files"]):
                seen.update((p, o) for _t, p, o in read_coordinates(uri))
    return seen


def _positions(url: str, source: str) -> dict[int, int | None]:
    with Metastore(url) as store:
        return {int(r["partition"]): r["next_offset"] for r in store.partitions(source)}


def _settings(url: str, bootstrap: str, **kafka: str) -> Settings:
    return settings(
        url, bootstrap, kafka_properties={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500", **kafka}
    )


def _delete_records(bootstrap: str, topic: str, before: int) -> None:
    """An operator's ``kafka-delete-records``: partition 0's log now starts at ``before``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, before)]).values():
        future.result(timeout=30)


def _expire_by_retention(bootstrap: str, topic: str) -> None:
    """Time-based retention: segments roll every 100 ms (partition 0 receives records in
    batches 300 ms apart), and with retention.ms = 1 s the broker's retention check (every
    second on the test broker) deletes every segment whose records are older than that: on
    Apache Kafka 4 the active one too (rolled first), so a slow check may delete every batch.
    The last batch is therefore produced once retention is off again: partition 0 ends at
    8050, its start above 50 and below the last batch."""
    set_configs = topic_configs_setter(bootstrap, topic)
    set_configs(segment_ms="100")
    for batch in range(7):
        time.sleep(0.3)
        _produce(bootstrap, topic, [(0, 200 + batch * 1000 + i) for i in range(1000)])
    set_configs(retention_ms="1000")
    wait_until(lambda: _watermarks(bootstrap, topic, 0)[0] > 50, 60, "retention to delete partition 0's start")
    set_configs(retention_ms="-1", segment_ms="604800000")  # nothing more is deleted from here on
    # A retention pass that had already started may still move the log start: wait until it holds still.
    seen = [_watermarks(bootstrap, topic, 0)[0]]
    wait_until(
        lambda: seen.append(_watermarks(bootstrap, topic, 0)[0]) or seen[-1] == seen[-2],
        30,
        "partition 0's log start to hold still",
        interval=2.0,
    )
    _produce(bootstrap, topic, [(0, 200 + 7 * 1000 + i) for i in range(1000)])


def _open_a_gap(
    url: str,
    bootstrap: str,
    topic: str,
    source: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
    others: int,
    how: str,
    **kafka: str,
) -> tuple[int, int]:
    """Publish 50 records per partition (a worker runs until then) and stop the worker; then
    partition 0 gets 8000 more records and loses its start (``how``: delete_records or
    retention), and every other partition gets ``others`` more. Returns partition 0's
    (earliest, high watermark): the stored offset 50 is no longer in the log."""
    _produce(bootstrap, topic, [(i % PARTITIONS, i) for i in range(200)])
    worker = start_worker(_settings(url, bootstrap, **kafka), source, spark_builder)
    wait_until(lambda: _positions(url, source) == {p: 50 for p in range(PARTITIONS)}, 120, "the first 200 records")
    worker.stop()
    if how == "delete_records":
        _produce(bootstrap, topic, [(0, i) for i in range(200, 8200)])
        _delete_records(bootstrap, topic, 5000)
    else:
        _expire_by_retention(bootstrap, topic)
    _produce(bootstrap, topic, [(p, 8200 + i) for i in range(others) for p in (1, 2, 3)])
    low, high = _watermarks(bootstrap, topic, 0)
    assert 50 < low < high == 8050, (low, high)
    return low, high


def _assert_skipped_once_and_exactly_once(url: str, topic: str, source: str, low: int, high: int, others: int) -> None:
    """The ledger holds one skipped gap, partition 0's [50, low); around it every record was
    published exactly once (partition 0 up to ``high``, the others up to ``others``). The
    ranges may jump over the gap only because the ledger says so."""
    with Metastore(url) as store:
        gaps = store.gaps(source)
        assert [(g["partition"], g["from_offset"], g["to_offset"], g["skipped"]) for g in gaps] == [(0, 50, low, True)]
        expected = {(topic, 0): [*range(50), *range(low, high)], **{(topic, p): list(range(others)) for p in (1, 2, 3)}}
        result = verify_exactly_once(store, source, expected)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"


def test_records_deleted_below_the_stored_offset_stop_the_partition_then_earliest_skips_them_with_a_ledger_row(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, bootstrap = database_url, kafka_bootstrap
    topic = make_topic(partitions=PARTITIONS)
    source, spec_path = write_spec(tmp_path, topic, max_records=2000, max_age="500ms")
    apply_spec(url, spec_path)

    low, high = _open_a_gap(url, bootstrap, topic, source, spark_builder, start_worker, others=30, how="delete_records")
    assert low == 5000

    # Policy "fail" (the default): partition 0 stops with its exact lost range; the others go on.
    worker = start_worker(_settings(url, bootstrap), source, spark_builder)
    with Metastore(url) as store:
        wait_until(lambda: bool(store.gaps(source)), 120, "the gap ledger row")
        wait_until(
            lambda: all(_positions(url, source)[p] == 80 for p in (1, 2, 3)), 120, "the other partitions to catch up"
        )
        gaps = store.gaps(source)
    assert [(g["partition"], g["from_offset"], g["to_offset"], g["skipped"]) for g in gaps] == [(0, 50, low, False)]
    assert _positions(url, source)[0] == 50  # nothing skipped
    assert worker.error is None and worker.thread.is_alive()  # no crash, no crash loop
    assert worker.worker.metrics.offset_gap_records.labels(source, "stopped")._value.get() == low - 50
    with Metastore(url) as store:
        status = source_status(store, _settings(url, bootstrap), source)
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "OFFSET_OUT_OF_RANGE")
    p0 = next(p for p in status["partitions"] if p["partition"] == 0)
    assert p0["state"] == "OFFSET_OUT_OF_RANGE" and p0["lost_range"] == [50, low]
    assert status["unacknowledged_gaps"] == 1
    assert any(e["kind"] == "OFFSET_OUT_OF_RANGE" and f"[50, {low})" in e["message"] for e in status["recent_errors"])
    worker.stop()

    # Policy "earliest": next_offset moves past the gap in the ledger row's transaction.
    source, spec_path = write_spec(
        tmp_path, topic, name=source, max_records=2000, max_age="500ms", extra='on_offset_out_of_range = "earliest"'
    )
    apply_spec(url, spec_path)
    worker = start_worker(_settings(url, bootstrap), source, spark_builder)
    wait_until(lambda: _positions(url, source)[0] == high, 180, "partition 0 to catch up past the gap")
    worker.stop()
    _assert_skipped_once_and_exactly_once(url, topic, source, low, high, others=80)
    assert not (set(_published(url, source)) & {(0, o) for o in range(50, low)})

    # Operators see and acknowledge it.
    monkeypatch.setenv("INGEST_DATABASE_URL", url)
    capsys.readouterr()  # the workers' log lines
    assert cli_main(["gaps", "list", source, "--json"]) == 0
    listed: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["gaps"]
    assert listed[0]["lost_records"] == low - 50 and listed[0]["acknowledged_at"] is None
    assert cli_main(["gaps", "ack", source, "--id", str(listed[0]["id"]), "--by", "tester"]) == 0
    with Metastore(url) as store:
        status = source_status(store, _settings(url, bootstrap), source)
    assert status["unacknowledged_gaps"] == 0 and status["offset_gaps"][0]["acknowledged_by"] == "tester"
    assert status["detailed_state"] != "OFFSET_OUT_OF_RANGE"


def test_records_expired_by_retention_are_skipped_under_eager_assignment_without_losing_the_other_partitions(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    """Under eager assignment every rebalance revokes and re-assigns everything: a gap on one
    partition is skipped (policy earliest) and the partitions that were fine lose nothing and
    publish nothing twice."""
    url, bootstrap = database_url, kafka_bootstrap
    topic = make_topic(partitions=PARTITIONS)
    source, spec_path = write_spec(
        tmp_path, topic, max_records=2000, max_age="500ms", extra='on_offset_out_of_range = "earliest"'
    )
    apply_spec(url, spec_path)
    eager = {"partition.assignment.strategy": "range"}
    low, high = _open_a_gap(
        url, bootstrap, topic, source, spark_builder, start_worker, others=300, how="retention", **eager
    )

    worker = start_worker(_settings(url, bootstrap, **eager), source, spark_builder)
    wait_until(
        lambda: _positions(url, source) == {0: high, 1: 350, 2: 350, 3: 350},
        180,
        "every partition to catch up, partition 0 past the gap",
    )
    worker.stop()
    _assert_skipped_once_and_exactly_once(url, topic, source, low, high, others=350)
