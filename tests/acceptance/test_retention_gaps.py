"""Retention gaps: the stored offset is below the partition's earliest offset.

The fallback Tansu broker cannot delete records (and stalls silently past the log end), so
these tests run the worker against librdkafka's mock cluster: a real TCP listener inside
this process that keeps only ~5 MB per partition and answers OFFSET_OUT_OF_RANGE like
Kafka (see ../shared/FIELD-NOTES.md). Records are padded to ~1 KB so that a few thousand
of them push the start of partition 0 out of the log.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.builder import SegmentBuilder
from ingest.cli import main as cli_main
from ingest.config import Settings
from ingest.embedded import produce_records
from ingest.status import source_status
from ingest.verify import read_coordinates, verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import StartWorker, apply_spec, sample_value, settings, wait_until, write_spec

TOPIC = "gaps"
PARTITIONS = 4  # the mock cluster auto-creates topics with 4 partitions
PAD = "x" * 1000


@pytest.fixture
def mock_bootstrap() -> Iterator[str]:
    """A librdkafka mock cluster, alive as long as the client that hosts it."""
    host = Producer({"test.mock.num.brokers": 1, "log_level": 3})
    brokers = list(host.list_topics(timeout=10).brokers.values())
    bootstrap = f"{brokers[0].host}:{brokers[0].port}"
    yield bootstrap
    host.flush(5)


def _value(i: int) -> bytes:
    doc = json.loads(sample_value(i))
    doc["pad"] = PAD  # not in the schema: ignored by the build, but counts against retention
    return json.dumps(doc).encode()


def _produce(bootstrap: str, records: list[tuple[int, int]]) -> None:
    """Produce (partition, id) records, every one delivered."""
    produce_records(bootstrap, TOPIC, ((p, str(i).encode(), _value(i)) for p, i in records))


def _watermarks(bootstrap: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "log_level": 3})
    try:
        low, high = consumer.get_watermark_offsets(KafkaTopicPartition(TOPIC, partition), timeout=10, cached=False)
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


def _mock_settings(url: str, bootstrap: str, **kafka: str) -> Settings:
    return settings(url, bootstrap, kafka_properties={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
                                                      "log_level": "3", **kafka})


def _open_a_gap(url: str, bootstrap: str, source: str, spark_builder: Callable[[], SegmentBuilder],
                start_worker: StartWorker, others: int, **kafka: str) -> tuple[int, int]:
    """Publish 50 records per partition (a worker runs until then), then produce ~8 MB into
    partition 0, which pushes offsets [0, earliest) out of the log, and ``others`` records
    into each other partition. Returns partition 0's (earliest, high watermark): the stored
    offset 50 is no longer in the log."""
    _produce(bootstrap, [(i % PARTITIONS, i) for i in range(200)])
    worker = start_worker(_mock_settings(url, bootstrap, **kafka), source, spark_builder)
    wait_until(lambda: _positions(url, source) == {p: 50 for p in range(PARTITIONS)}, 120, "the first 200 records")
    worker.stop()
    _produce(bootstrap, [(0, i) for i in range(200, 8200)])
    _produce(bootstrap, [(p, 8200 + i) for i in range(others) for p in (1, 2, 3)])
    low, high = _watermarks(bootstrap, 0)
    assert 50 < low < high == 8050, (low, high)
    return low, high


def _assert_skipped_once_and_exactly_once(url: str, source: str, low: int, high: int, others: int) -> None:
    """The ledger holds one skipped gap, partition 0's [50, low); around it every record was
    published exactly once (partition 0 up to ``high``, the others up to ``others``). The
    ranges may jump over the gap only because the ledger says so."""
    with Metastore(url) as store:
        gaps = store.gaps(source)
        assert [(g["partition"], g["from_offset"], g["to_offset"], g["skipped"]) for g in gaps] == [(0, 50, low, True)]
        expected = {(TOPIC, 0): [*range(50), *range(low, high)], **{(TOPIC, p): list(range(others)) for p in (1, 2, 3)}}
        result = verify_exactly_once(store, source, expected)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"


def test_offset_below_earliest_stops_the_partition_then_earliest_skips_it_with_a_ledger_row(
    tmp_path: Path, database_url: str, mock_bootstrap: str, spark_builder: Callable[[], SegmentBuilder],
    start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = database_url
    source, spec_path = write_spec(tmp_path, TOPIC, max_records=2000, max_age="500ms")
    apply_spec(url, spec_path)

    low, high = _open_a_gap(url, mock_bootstrap, source, spark_builder, start_worker, others=30)

    # Policy "fail" (the default): partition 0 stops with its exact lost range; the others go on.
    worker = start_worker(_mock_settings(url, mock_bootstrap), source, spark_builder)
    with Metastore(url) as store:
        wait_until(lambda: bool(store.gaps(source)), 120, "the gap ledger row")
        wait_until(lambda: all(_positions(url, source)[p] == 80 for p in (1, 2, 3)), 120,
                   "the other partitions to catch up")
        gaps = store.gaps(source)
    assert [(g["partition"], g["from_offset"], g["to_offset"], g["skipped"]) for g in gaps] == [(0, 50, low, False)]
    assert _positions(url, source)[0] == 50  # nothing skipped
    assert worker.error is None and worker.thread.is_alive()  # no crash, no crash loop
    assert worker.worker.metrics.offset_gap_records.labels(source, "stopped")._value.get() == low - 50
    with Metastore(url) as store:
        status = source_status(store, _mock_settings(url, mock_bootstrap), source)
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "OFFSET_OUT_OF_RANGE")
    p0 = next(p for p in status["partitions"] if p["partition"] == 0)
    assert p0["state"] == "OFFSET_OUT_OF_RANGE" and p0["lost_range"] == [50, low]
    assert status["unacknowledged_gaps"] == 1
    assert any(e["kind"] == "OFFSET_OUT_OF_RANGE" and f"[50, {low})" in e["message"] for e in status["recent_errors"])
    worker.stop()

    # Policy "earliest": next_offset moves past the gap in the ledger row's transaction.
    source, spec_path = write_spec(tmp_path, TOPIC, name=source, max_records=2000, max_age="500ms",
                                   extra='on_offset_out_of_range = "earliest"')
    apply_spec(url, spec_path)
    worker = start_worker(_mock_settings(url, mock_bootstrap), source, spark_builder)
    wait_until(lambda: _positions(url, source)[0] == high, 180, "partition 0 to catch up past the gap")
    worker.stop()
    _assert_skipped_once_and_exactly_once(url, source, low, high, others=80)
    assert not (set(_published(url, source)) & {(0, o) for o in range(50, low)})

    # Operators see and acknowledge it.
    monkeypatch.setenv("INGEST_DATABASE_URL", url)
    capsys.readouterr()  # the workers' log lines
    assert cli_main(["gaps", "list", source, "--json"]) == 0
    listed: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert listed[0]["lost_records"] == low - 50 and listed[0]["acknowledged_at"] is None
    assert cli_main(["gaps", "ack", source, "--id", str(listed[0]["id"]), "--by", "tester"]) == 0
    with Metastore(url) as store:
        status = source_status(store, _mock_settings(url, mock_bootstrap), source)
    assert status["unacknowledged_gaps"] == 0 and status["offset_gaps"][0]["acknowledged_by"] == "tester"
    assert status["detailed_state"] != "OFFSET_OUT_OF_RANGE"


def test_earliest_skips_the_gap_under_eager_assignment_without_losing_the_other_partitions(
    tmp_path: Path, database_url: str, mock_bootstrap: str, spark_builder: Callable[[], SegmentBuilder],
    start_worker: StartWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    """After OFFSET_OUT_OF_RANGE librdkafka's fetcher for the partition refuses ``seek``; under
    eager assignment the worker can only re-assign everything, so the partitions that were fine
    are re-assigned at the position they reached: none of their records may be skipped or read twice."""
    url = database_url
    source, spec_path = write_spec(tmp_path, TOPIC, max_records=2000, max_age="500ms",
                                   extra='on_offset_out_of_range = "earliest"')
    apply_spec(url, spec_path)
    eager = {"partition.assignment.strategy": "range"}
    low, high = _open_a_gap(url, mock_bootstrap, source, spark_builder, start_worker, others=300, **eager)

    capsys.readouterr()
    worker = start_worker(_mock_settings(url, mock_bootstrap, **eager), source, spark_builder)
    wait_until(lambda: _positions(url, source) == {0: high, 1: 350, 2: 350, 3: 350}, 180,
               "every partition to catch up, partition 0 past the gap")
    worker.stop()
    # The eager fallback of the re-seek ran (a plain seek is refused after OUT_OF_RANGE).
    assert "partition_fetch_restarted" in capsys.readouterr().out
    _assert_skipped_once_and_exactly_once(url, source, low, high, others=350)
