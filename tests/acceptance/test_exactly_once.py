"""End to end in one process: real broker, real PostgreSQL, real Spark (shared session)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ingest.builder.job import BuilderFactory, BuildResult, SegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.builder.registration import BuildRegistrar
from ingest.errors import ParseFailure
from ingest.spec.model import SourceSpec
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    NewSource,
    Produced,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    settings,
    write_spec,
)
from tests.fixtures.servers import MakeTopic


def test_one_worker_publishes_every_offset_exactly_once(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(6, max_records=6000, max_age="1s")
    produced.produce(50_000)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up")
    worker.stop()
    assert worker.error is None
    result = assert_exactly_once(database_url, source, produced)
    assert result.rows == 50_000 and result.rejects == 0
    assert worker.consumed() == 50_000  # one worker, no rebalance: nothing read twice


def test_a_cooperative_rebalance_kills_only_the_splits_of_partitions_that_move(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    """A split of each partition is in flight (each waits 5 s between its build and its publish)
    when a second worker joins: the splits of the partitions that move are killed and read again
    by their new owner from the stored offset; those of the partitions that stay are published,
    none read twice."""
    topic = make_topic(partitions=6)
    source, spec_path = write_spec(tmp_path, topic, max_records=100, max_age="10m")
    apply_spec(database_url, spec_path)
    produced = Produced(kafka_bootstrap, topic, 6)
    produced.produce(600)
    first = start_worker(settings(database_url, kafka_bootstrap, fault_publish_delay_s=5.0), source, spark_builder)
    metrics = first.worker.metrics
    wait_until(lambda: metrics.inflight_splits.labels(source)._value.get() == 6, 60, "a split of each partition")
    second = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    wait_until(
        lambda: 0 < len(first.worker.assignment) < 6 and len(second.worker.assignment) > 0,
        90,
        "a cooperative rebalance",
    )
    kept = len(first.worker.assignment)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 120, "every offset published")
    second.stop()
    first.stop()
    assert first.error is None and second.error is None
    assert_exactly_once(database_url, source, produced)
    # The kept partitions' splits were published by the first worker, the others' killed.
    assert first.consumed() == 100 * kept
    assert metrics.splits_killed.labels(source, "revoke")._value.get() == 6 - kept
    assert second.consumed() == 100 * (6 - kept)


class ZombieBuilder:
    """Builds for real, then lets another worker claim the partition before the publish."""

    def __init__(self, inner: SegmentBuilder, database_url: str, source: str) -> None:
        self.inner = inner
        self.database_url = database_url
        self.source = source
        self.zombie_splits: list[BuiltSegment] = []

    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuildResult]:
        results = self.inner.build_batch(splits, spec)
        for split, built in zip(splits, results, strict=True):
            if split.tp.partition == 0 and not self.zombie_splits and isinstance(built, BuiltSegment):
                with Metastore(self.database_url) as store:
                    store.claim_partitions(self.source, "usurper", [split.tp])
                self.zombie_splits.append(built)
        return results


def test_a_publish_after_the_serial_moved_on_is_rejected_and_invisible(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(2, max_records=100, max_age="1s")
    produced.produce(400)
    zombies: list[ZombieBuilder] = []

    def zombie_builder(registrar: BuildRegistrar, reader: KafkaReader) -> ZombieBuilder:
        zombies.append(ZombieBuilder(spark_builder(registrar, reader), database_url, source))
        return zombies[-1]

    worker = start_worker(settings(database_url, kafka_bootstrap), source, zombie_builder)
    metrics = worker.worker.metrics
    wait_until(lambda: metrics.publish_conflicts.labels(source, "serial")._value.get() >= 1, 60, "the rejected publish")
    worker.stop()
    rejected = zombies[0].zombie_splits[0]
    with Metastore(database_url) as store:
        segments = store.segments(source)
        assert str(rejected.split_id) not in {str(s["split_id"]) for s in segments}
        assert not any(set(rejected.files) & set(s["files"]) for s in segments)
        assert store.conflict_counts(source) == {"serial": 1}
        positions = {r["partition"]: r["next_offset"] for r in store.partitions(source)}
    assert positions[0] == 0  # partition 0 never published: fenced at its first split, still at its pinned start
    assert positions[1] == produced.ends[1]
    assert not any(Path(f.removeprefix("file://")).exists() for f in rejected.files)
    # A new worker claims partition 0 and publishes it; everything exactly once.
    again = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 60, "the new worker to catch up")
    again.stop()
    assert_exactly_once(database_url, source, produced)


BAD_VALUES: dict[str, bytes | None] = {
    "invalid_json": b'{"id": 1, "user": ',
    "type_mismatch": b'{"id": "not a number", "user": "x", "ts": "2026-11-22T10:00:00Z"}',
    "invalid_utf8": b'{"id": 2, "user": "\xff\xfe", "ts": "2026-11-22T10:00:00Z"}',
    "null_value": None,
    "missing_event_time": b'{"id": 3, "user": "y"}',
}


def bad_every_tenth(i: int) -> bytes | None:
    if i % 10 == 9:
        kinds = list(BAD_VALUES)
        return BAD_VALUES[kinds[(i // 10) % len(kinds)]]
    if i % 10 == 4:  # JSON nulls in ordinary columns are valid
        return json.dumps({"id": i, "user": None, "ts": "2026-11-22T10:00:00Z", "amount": None, "tags": None}).encode()
    return json.dumps({"id": i, "user": f"u{i}", "ts": "2026-11-22T10:00:00Z", "amount": 1.5, "tags": ["t"]}).encode()


@pytest.mark.parametrize("policy", ["reject", "skip"])
def test_parse_errors_are_rejected_or_skipped_exactly_once(
    policy: str,
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(2, max_records=250, on_parse_error=policy)
    produced.produce(1000, bad_every_tenth)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to catch up")
        segments = store.segments(source)
    worker.stop()
    assert worker.error is None
    good = sum(s["row_count"] for s in segments)
    assert good == 900
    if policy == "reject":
        result = assert_exactly_once(database_url, source, produced)
        assert result.rejects == 100
        errors: dict[str, int] = {}
        for s in segments:
            for f in s["rejects_files"]:
                table = pq.read_table(f.removeprefix("file://"))
                assert table.column_names[-1] == "_error"
                for e in table["_error"].to_pylist():
                    errors[e] = errors.get(e, 0) + 1
        assert errors == dict.fromkeys(BAD_VALUES, 20)
    else:
        assert sum(s["skipped_count"] for s in segments) == 100
        assert not any(s["rejects_files"] for s in segments)


def test_fail_policy_stops_the_worker_naming_the_record(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(1, max_records=50, on_parse_error="fail")
    topic = produced.topic
    produced.produce(
        120, lambda i: b"not json" if i == 77 else json.dumps({"id": i, "ts": "2026-11-22T10:00:00Z"}).encode()
    )
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    worker.thread.join(90)
    assert isinstance(worker.error, ParseFailure)
    assert (worker.error.topic, worker.error.partition, worker.error.offset) == (topic, 0, 77)
    assert "offset=77" in str(worker.error)
    with Metastore(database_url) as store:
        positions = {r["partition"]: r["next_offset"] for r in store.partitions(source)}
    assert positions[0] == 50  # the split holding offset 77 (and anything after) was not published


def test_eager_rebalancing_is_exactly_once_too(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(4, max_records=700, max_age="1s")
    produced.produce(4000)
    props = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500", "partition.assignment.strategy": "range"}
    first = start_worker(settings(database_url, kafka_bootstrap, kafka_properties=props), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: len(store.segments(source)) >= 1, 60, "a first segment")
        second = start_worker(settings(database_url, kafka_bootstrap, kafka_properties=props), source, spark_builder)
        produced.produce(4000)
        wait_until(lambda: produced.caught_up(store, source), 120, "both workers to catch up")
        serials = {r["partition"]: r["serial"] for r in store.partitions(source)}
    first.stop()
    second.stop()
    assert first.error is None and second.error is None
    assert max(serials.values()) >= 2  # an eager rebalance re-claimed partitions
    assert_exactly_once(database_url, source, produced)
