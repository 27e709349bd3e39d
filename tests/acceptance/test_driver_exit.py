"""A worker whose local Spark driver JVM dies (SIGKILL, the kernel's OOM killer) exits at once
with one line, rather than failing builds until /healthz has it restarted; nothing it held was
published, and a successor publishes every offset once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ingest_dev.ingest_process import IngestProcess
from ingest_dev.testkit import java_under, wait_until
from metastore import Metastore
from tests.acceptance.harness import NewSource, assert_exactly_once, process_env

pytestmark = pytest.mark.process


def test_a_worker_whose_spark_jvm_dies_exits_at_once_and_a_successor_publishes_everything_once(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource
) -> None:
    source, produced = new_source(1, max_records=500, max_age="1s")
    produced.produce(500)
    env = process_env(database_url, kafka_bootstrap, INGEST_WARM_UP_RECORDS="0", INGEST_METRICS_PORT="0")
    worker = IngestProcess.worker(env, source, tmp_path, "first")
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source) or worker.poll() is not None, 240, "a first publish")
        assert worker.poll() is None, worker.log_tail()
        assert worker.pid is not None
        jvm = java_under(worker.pid)
        assert jvm is not None, "no JVM under the worker"
        os.kill(jvm, signal.SIGKILL)
        killed = time.monotonic()
        produced.produce(500)  # a split to build on the dead JVM
        wait_until(lambda: worker.poll() is not None, 60, "the worker to exit", detail=worker.log_tail)
        took = time.monotonic() - killed
        print(f"exited {took:.1f} s after its JVM was killed")
    finally:
        worker.stop(timeout=60)
    assert worker.poll() == 1, worker.log_tail()
    assert worker.has_event("spark_driver_exited"), worker.log_tail()
    assert "the Spark driver JVM exited (status -9)" in worker.log_tail(), worker.log_tail()
    # One failed build and one retry after the pipeline's backoff, not a streak of them.
    assert took < 30, took

    successor = IngestProcess.worker(env, source, tmp_path, "successor")
    try:
        with Metastore(database_url) as store:
            wait_until(
                lambda: produced.caught_up(store, source) or successor.poll() is not None,
                240,
                "the successor to publish the rest",
                detail=successor.log_tail,
            )
    finally:
        successor.stop(timeout=60)
    assert successor.poll() == 0, successor.log_tail()
    assert_exactly_once(database_url, source, produced)
