"""Worker processes under rebalances, crashes and zombies (each process runs its own Spark)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from ingest_dev.ingest_process import IngestProcess
from ingest_dev.testkit import wait_until
from ingest_dev.verify import verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import (
    GROUP_PROTOCOLS,
    NewSource,
    Produced,
    assert_exactly_once,
    process_env,
)

pytestmark = pytest.mark.process


@pytest.fixture(params=GROUP_PROTOCOLS)
def group_protocol(request: pytest.FixtureRequest) -> str:
    """Each test runs under the classic cooperative-sticky protocol and under KIP-848's."""
    return str(request.param)


def background_producer(produced: Produced, batches: int, batch: int, pause_s: float) -> threading.Thread:
    def run() -> None:
        for _ in range(batches):
            produced.produce(batch)
            time.sleep(pause_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_rebalances_under_load_publish_every_offset_exactly_once(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, group_protocol: str
) -> None:
    source, produced = new_source(6, max_records=2000, max_age="1s")
    env = process_env(database_url, kafka_bootstrap, group_protocol)
    workers = [IngestProcess.worker(env, source, tmp_path, f"w{i}") for i in range(3)]
    try:
        producer = background_producer(produced, batches=30, batch=2000, pause_s=1.0)
        with Metastore(database_url) as store:
            wait_until(lambda: len(store.segments(source)) >= 3, 120, "the first segments")
            workers[0].stop(timeout=60)  # graceful: publishes what it holds, leaves the group
            time.sleep(3)
            workers[1].kill()  # crash: its partitions move after the session timeout
            time.sleep(3)
            workers.append(IngestProcess.worker(env, source, tmp_path, "w3"))  # scale up again
            producer.join(120)
            assert not producer.is_alive()
            wait_until(lambda: produced.caught_up(store, source), 240, "the fleet to catch up")
    finally:
        for w in workers:
            w.stop(timeout=60)
    assert workers[0].poll() == 0
    result = assert_exactly_once(database_url, source, produced)
    assert result.rows == 60_000


def test_a_stopped_zombie_cannot_publish_after_its_partitions_moved(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, group_protocol: str
) -> None:
    source, produced = new_source(2, max_records=500, max_age="1s")
    produced.produce(2000)
    # The zombie pauses 4 s between building a split and publishing it: the window to freeze it in.
    zombie = IngestProcess.worker(
        process_env(database_url, kafka_bootstrap, group_protocol, INGEST_FAULT_PUBLISH_DELAY_S="4"),
        source,
        tmp_path,
        "zombie",
    )
    other: IngestProcess | None = None
    try:
        wait_until(lambda: zombie.has_event("split_sealed"), 90, "the zombie to seal a split")
        zombie.signal(signal.SIGSTOP)
        other = IngestProcess.worker(
            process_env(database_url, kafka_bootstrap, group_protocol), source, tmp_path, "other"
        )
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source), 120, "the other worker to take over")
        published_while_frozen = sum(1 for e in zombie.events() if e.get("event") == "segment_published")
        zombie.signal(signal.SIGCONT)
        # Its in-flight split is either refused by the metastore (serial) or killed by on_lost.
        wait_until(
            lambda: (
                zombie.has_event("publish_rejected", reason="serial") or zombie.has_event("split_killed", reason="lost")
            ),
            60,
            "the zombie to be fenced",
        )
        assert sum(1 for e in zombie.events() if e.get("event") == "segment_published") == published_while_frozen
        produced.produce(1000)
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source), 120, "the fleet to catch up again")
    finally:
        zombie.signal(signal.SIGCONT)
        zombie.stop(timeout=60)
        if other is not None:
            other.stop(timeout=60)
    assert_exactly_once(database_url, source, produced)


# Resuming after a crash reads the metastore, whatever the group protocol: one protocol suffices
# (the rebalance and zombie tests run under both).
@pytest.mark.parametrize("group_protocol", ["consumer"])
def test_a_crashed_fleet_resumes_from_the_metastore_offsets(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, group_protocol: str
) -> None:
    source, produced = new_source(4, max_records=1000, max_age="1s")
    env = process_env(database_url, kafka_bootstrap, group_protocol)
    produced.produce(20_000)
    first = [IngestProcess.worker(env, source, tmp_path, f"a{i}") for i in range(2)]
    with Metastore(database_url) as store:
        wait_until(lambda: len(store.segments(source)) >= 2, 120, "some segments")
        for w in first:
            w.kill()
        assert not produced.caught_up(store, source)
        produced.produce(10_000)
        second = [IngestProcess.worker(env, source, tmp_path, f"b{i}") for i in range(2)]
        try:
            wait_until(lambda: produced.caught_up(store, source), 180, "the new fleet to catch up")
        finally:
            for w in second:
                w.stop(timeout=60)
    assert_exactly_once(database_url, source, produced)


def test_a_latest_source_loses_nothing_produced_after_its_first_claim(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource
) -> None:
    """The first worker claims every partition of a ``latest`` source, reads, and dies before
    its first publish; the next one must start where the first claim started, not at the log
    end of its own claim."""
    source, produced = new_source(6, max_records=5000, max_age="1s", extra='start_from = "latest"')
    topic = produced.topic
    produced.produce(600)  # before the source reads: "latest" leaves these out
    before = dict(produced.ends)
    env = process_env(database_url, kafka_bootstrap)
    # Builds, then waits 600 s before each publish: it dies with everything it read unpublished.
    first = IngestProcess.worker({**env, "INGEST_FAULT_PUBLISH_DELAY_S": "600"}, source, tmp_path, "first")
    second: IngestProcess | None = None
    try:
        with Metastore(database_url) as store:

            def claimed() -> bool:
                rows = store.partitions(source)
                return len(rows) == 6 and all(r["next_offset"] is not None for r in rows)

            wait_until(claimed, 90, "the first worker's claim")
            assert {r["partition"]: r["next_offset"] for r in store.partitions(source)} == before
            produced.produce(1200)
            wait_until(lambda: first.has_event("split_sealed"), 90, "the first worker to read and seal")
            first.kill()
            assert store.segments(source) == []
            produced.produce(1200)
            second = IngestProcess.worker(env, source, tmp_path, "second")
            wait_until(lambda: produced.caught_up(store, source), 120, "the second worker to publish everything")
    finally:
        first.kill()
        if second is not None:
            second.stop(timeout=60)
    expected = {(topic, p): list(range(before[p], end)) for p, end in produced.ends.items()}
    with Metastore(database_url) as store:
        result = verify_exactly_once(store, source, expected)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    assert result.rows == 2400
