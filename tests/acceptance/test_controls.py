"""Operator controls while workers ingest: suspend / resume / drain, exactly once throughout."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ingest.builder.job import BuilderFactory
from ingest.consume import heartbeats as registry_module
from ingest_dev.testkit import wait_until
from ingest_dev.verify import Verification, verify_epochs, verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import (
    NewSource,
    Produced,
    StartWorker,
    ThreadWorker,
    apply_spec,
    assert_exactly_once,
    process_env,
    settings,
    write_spec,
)
from tests.acceptance.test_cli import assert_one_line_error, ingest


def steady_producer(produced: Produced, batches: int, pause_s: float = 0.3) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: [(produced.produce(300), time.sleep(pause_s)) for _ in range(batches)], daemon=True
    )
    thread.start()
    return thread


def worker_states(database_url: str, source: str) -> list[str]:
    with Metastore(database_url) as store:
        return [w["state"] for w in store.live_workers(source)]


def test_suspend_publishes_what_is_in_the_log_and_resume_continues(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=3)
    source, spec_path = write_spec(tmp_path, topic, max_records=100_000, max_age="10m")  # cut only on command
    apply_spec(database_url, spec_path)
    env = process_env(database_url, kafka_bootstrap)
    produced = Produced(kafka_bootstrap, topic, 3)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    steady_producer(produced, 10).join(60)
    wait_until(lambda: available(worker) == produced.next_id, 30, "everything to be in the log, none cut")
    assert ingest(env, "suspend", source).returncode == 0
    with Metastore(database_url) as store:
        # Suspending publishes what was in the log although no split limit was reached.
        wait_until(lambda: produced.caught_up(store, source), 60, "the records in the log to be published")
    wait_until(lambda: worker_states(database_url, source) == ["suspended"], 15, "the worker to report suspended")
    produced.produce(900)
    time.sleep(3)
    assert worker.consumed() == produced.next_id - 900  # paused: nothing new taken
    assert worker.thread.is_alive() and len(worker.worker.assignment) == 3  # still in the group
    # Lag that does not shrink is what suspending means: SUSPENDED, healthy, never STUCK.
    impatient = {**env, "INGEST_STUCK_AFTER_S": "1"}
    status = json.loads(ingest(impatient, "status", source, "--json").stdout)
    assert (status["state"], status["detailed_state"]) == ("SUSPENDED", "SUSPENDED"), status
    assert status["total_lag"] == 900 and {p["state"] for p in status["partitions"]} <= {"OK", "SUSPENDED"}
    assert ingest(impatient, "health", source).returncode == 0
    assert ingest(env, "resume", source).returncode == 0
    wait_until(lambda: available(worker) == 900, 30, "the cuts to go on")
    assert ingest(env, "drain", source, "--timeout", "60", timeout=90).returncode == 0  # publishes the 900
    worker.thread.join(30)
    assert_exactly_once(database_url, source, produced)


def available(worker: ThreadWorker) -> int:
    """Offsets in the log of the worker's partitions, not cut yet."""
    return sum(o.cutter.available() for o in worker.worker.assignment)


def test_drain_publishes_everything_in_the_log_and_the_worker_exits(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=3)
    source, spec_path = write_spec(tmp_path, topic, max_records=100_000, max_age="10m")  # nothing seals alone
    apply_spec(database_url, spec_path)
    env = process_env(database_url, kafka_bootstrap)
    produced = Produced(kafka_bootstrap, topic, 3)
    produced.produce(3000)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    wait_until(lambda: available(worker) == 3000, 30, "everything to be in the log, none cut")
    result = ingest(env, "drain", source, "--timeout", "60", timeout=90)
    assert result.returncode == 0 and "drained" in result.stdout, result.stderr
    worker.thread.join(30)
    assert not worker.thread.is_alive() and worker.error is None  # exited by itself, cleanly
    with Metastore(database_url) as store:
        assert produced.caught_up(store, source)  # every fetched record was published
    assert_exactly_once(database_url, source, produced)


def test_drain_with_stay_holds_the_fleet_until_resume(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(4, max_records=1000, max_age="5s")
    env = process_env(database_url, kafka_bootstrap)
    workers = [start_worker(settings(database_url, kafka_bootstrap), source, spark_builder) for _ in range(2)]
    producer = steady_producer(produced, 15)
    time.sleep(4)
    drain: dict[str, subprocess.CompletedProcess[str]] = {}
    drainer = threading.Thread(
        target=lambda: drain.update(result=ingest(env, "drain", source, "--stay", "--timeout", "90", timeout=120))
    )
    drainer.start()
    # A worker with little in flight passes through DRAINING within one heartbeat, so either state shows it began.
    wait_until(
        lambda: bool({"draining", "drained"} & set(worker_states(database_url, source))), 15, "the drain to begin"
    )
    # A worker started while the drain is pending takes nothing until `resume`.
    late = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    drainer.join(120)
    producer.join(60)
    assert drain["result"].returncode == 0 and "drained" in drain["result"].stdout, drain["result"].stderr
    assert all(w.thread.is_alive() for w in [*workers, late])  # --stay: idle, still in the group

    def published() -> dict[int, int | None]:
        with Metastore(database_url) as store:
            return {r["partition"]: r["next_offset"] for r in store.partitions(source)}

    at_drain = published()
    produced.produce(1000)
    time.sleep(4)
    assert late.consumed() == 0
    assert published() == at_drain  # drained: nothing moves until resume
    assert ingest(env, "resume", source).returncode == 0
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the fleet to catch up after resume")
    for w in [*workers, late]:
        w.stop()
    assert_exactly_once(database_url, source, produced)


# -- reset, terminate, spec updates, NOTIFY ------------------------------------------------


def assert_exactly_once_per_epoch(database_url: str, source: str, produced: Produced) -> Verification:
    """With resets, every offset of a replayed range appears once per epoch (see verify_epochs)."""
    with Metastore(database_url) as store:
        result = verify_epochs(store, source, {(produced.topic, p): end for p, end in produced.ends.items()})
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    return result


def gauge(worker: ThreadWorker, name: str) -> float:
    return getattr(worker.worker.metrics, name).labels(worker.worker.source)._value.get()  # type: ignore[no-any-return]


def test_reset_under_load_fences_in_flight_work_and_replays_once_per_epoch(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(2, max_records=400, max_age="1s")
    topic = produced.topic
    env = process_env(database_url, kafka_bootstrap)
    # A publish waits 1 s after its build, so splits are in flight when the reset commits.
    worker = start_worker(settings(database_url, kafka_bootstrap, fault_publish_delay_s=1.0), source, spark_builder)
    producer = steady_producer(produced, 12)

    def stored(partition: int) -> int | None:
        with Metastore(database_url) as store:
            return {r["partition"]: r["next_offset"] for r in store.partitions(source)}[partition]

    wait_until(
        lambda: (stored(0) or 0) > 0 and gauge(worker, "inflight_splits") > 0,
        60,
        "a first publish and splits in flight",
    )
    # Replaying needs --yes: refused with one line, nothing changed.
    before = stored(0)
    refused = ingest(env, "reset", source, "--to", f"{topic}:0=0")
    assert_one_line_error(refused, 10, "replays", "--yes")
    with Metastore(database_url) as store:
        assert store.recent_resets(source) == [] and stored(0) >= (before or 0)
    wait_until(lambda: gauge(worker, "inflight_splits") > 0, 30, "splits in flight")
    result = ingest(env, "reset", source, "--to", "0=0", "--reason", "replay after a bad deploy", "--yes")
    assert result.returncode == 0 and "replays [0, " in result.stdout, result.stderr
    with Metastore(database_url) as store:
        [audit] = store.recent_resets(source)
        [p] = audit["partitions"]
        assert audit["reason"] == "replay after a bad deploy" and "@" in audit["actor"]
        assert p["partition"] == 0 and p["new_offset"] == 0 and p["replayed_end"] == p["old_offset"] > 0
    producer.join(60)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to re-read and catch up")
        # The old epoch's in-flight work was dropped (kill switch) or refused (serial).
        conflicts = store.conflict_counts(source)
    killed = worker.worker.metrics.splits_killed.labels(source, "reset")._value.get()
    assert killed + conflicts.get("serial", 0) >= 1, (killed, conflicts)
    status = ingest(env, "status", source)
    assert status.returncode == 0 and f"reset #{audit['id']}" in status.stdout, status.stderr
    worker.stop()
    assert worker.error is None
    verification = assert_exactly_once_per_epoch(database_url, source, produced)
    # The replayed range is in the output twice: once per epoch.
    assert verification.rows == sum(produced.ends.values()) + p["old_offset"]


def test_terminate_drains_under_load_then_the_source_stays_terminated(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=3)
    source, spec_path = write_spec(tmp_path, topic, max_records=100_000, max_age="10m")  # seals only on command
    apply_spec(database_url, spec_path)
    env = process_env(database_url, kafka_bootstrap)
    produced = Produced(kafka_bootstrap, topic, 3)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    producer = steady_producer(produced, 10)
    wait_until(lambda: available(worker) > 600, 30, "records in the log, none cut")
    result = ingest(env, "terminate", source, "--timeout", "60", timeout=90)
    assert result.returncode == 0 and "terminated" in result.stdout, result.stderr
    worker.thread.join(30)
    assert not worker.thread.is_alive() and worker.error is None  # drained and exited by itself
    producer.join(60)
    with Metastore(database_url) as store:
        fetched = {(topic, r["partition"]): list(range(r["next_offset"] or 0)) for r in store.partitions(source)}
        # What was in the log when the hold began was published, exactly once (later records stay in Kafka).
        assert sum(len(v) for v in fetched.values()) == worker.consumed() > 600
        verification = verify_exactly_once(store, source, fetched)
        assert verification.ok, verification.summary()
    refused = ingest(env, "worker", source)
    assert_one_line_error(refused, 9, "terminated", "--reactivate")
    assert_one_line_error(ingest(env, "resume", source), 9, "terminated")
    status = ingest(env, "status", source, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "TERMINATED", status.stderr
    assert ingest(env, "segments", source).returncode == 0
    assert ingest(env, "source", "history", source).returncode == 0


def test_a_spec_update_is_picked_up_by_a_running_worker(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=2)
    source, spec_path = write_spec(tmp_path, topic, max_records=300, max_age="1s")
    full = spec_path.read_text()
    spec_path.write_text(full.replace('amount = "double"\n', ""))  # version 1 lacks a column
    apply_spec(database_url, spec_path)
    env = process_env(database_url, kafka_bootstrap)
    produced = Produced(kafka_bootstrap, topic, 2)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    producer = steady_producer(produced, 15)

    def versions() -> list[int]:
        with Metastore(database_url) as store:
            return [int(s["spec_version"]) for s in sorted(store.segments(source), key=lambda s: s["id"])]

    wait_until(lambda: len(versions()) >= 2, 60, "segments built with version 1")
    spec_path.write_text(full)
    applied = ingest(env, "source", "apply", str(spec_path))
    assert applied.returncode == 0 and "version 2" in applied.stdout, applied.stderr
    producer.join(60)
    # Under load the first batches may all be sealed before the worker sees version 2: keep producing.
    producer = steady_producer(produced, 5)
    wait_until(lambda: 2 in versions(), 60, "a segment built with version 2")
    producer.join(60)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to catch up")
        segments = sorted(store.segments(source), key=lambda s: s["id"])
        [registered] = store.live_workers(source)
    assert worker.thread.is_alive() and registered["spec_version"] == 2  # picked up without a restart
    assert worker.worker.metrics.splits_killed.labels(source, "rewind")._value.get() == 0  # consumption never stopped
    per_partition: dict[int, list[int]] = {}
    for s in segments:
        per_partition.setdefault(s["ranges"][0]["partition"], []).append(int(s["spec_version"]))
    assert all(v == sorted(v) for v in per_partition.values())  # switched at a split boundary, never back
    v1 = next(s for s in segments if s["spec_version"] == 1)
    v2 = next(s for s in segments if s["spec_version"] == 2)
    assert "amount" not in pq.read_schema(v1["files"][0].removeprefix("file://")).names
    assert "amount" in pq.read_schema(v2["files"][0].removeprefix("file://")).names
    history = ingest(env, "source", "history", source, "--json")
    assert history.returncode == 0, history.stderr
    assert [(v["version"], v["changes"]) for v in json.loads(history.stdout)["versions"]] == [
        (1, ["created"]),
        (2, ["+column amount double"]),
    ]
    worker.stop()
    assert_exactly_once(database_url, source, produced)


def test_a_control_applies_through_notify_long_before_the_heartbeat_poll(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers would poll the controls every 10 minutes: only NOTIFY can deliver them within the test.
    monkeypatch.setattr(registry_module, "HEARTBEAT_INTERVAL_S", 600.0)
    source, produced = new_source(2, max_records=500, max_age="1s")
    env = process_env(database_url, kafka_bootstrap)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    producer = steady_producer(produced, 6)
    wait_until(lambda: worker.consumed() > 0 and len(worker.worker.assignment) == 2, 30, "consumption")
    producer.join(60)
    assert ingest(env, "suspend", source).returncode == 0
    wait_until(
        lambda: gauge(worker, "paused_partitions") == 2 and gauge(worker, "inflight_splits") == 0,
        60,
        "the worker to publish what it held and pause",
    )
    consumed = worker.consumed()
    produced.produce(600)
    time.sleep(2)
    assert worker.consumed() == consumed  # suspended: nothing new taken
    assert ingest(env, "resume", source).returncode == 0
    wait_until(lambda: worker.consumed() == produced.next_id, 60, "consumption to resume")
    worker.stop()
    assert_exactly_once(database_url, source, produced)
