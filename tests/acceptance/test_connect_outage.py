"""A worker on Spark Connect whose server dies (SIGKILL): its calls give up within
``INGEST_SPARK_CONNECT_RETRY_S``, the failed builds are retried on the same splits, and once a
new server listens the worker replaces the session the server lost and goes on by itself,
every offset published once; a SIGTERM while the server is dead exits without waiting for it.

These tests kill their server, so they start one of their own (the session's ``spark_connect``
fixture is shared), once for the module.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingest_dev.ingest_process import IngestProcess
from ingest_dev.spark_connect import LocalConnectServer
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import NewSource, assert_exactly_once, process_env

pytestmark = pytest.mark.process

# Each client call gives up on a dead server after this (the default is 30 s).
RETRY_S = 4.0


@pytest.fixture(scope="module")
def connect_server() -> Iterator[LocalConnectServer]:
    with LocalConnectServer() as server:
        yield server


def connect_worker(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, server: LocalConnectServer, source: str, name: str
) -> IngestProcess:
    env = process_env(
        database_url,
        kafka_bootstrap,
        INGEST_SPARK_MASTER=server.url,
        INGEST_SPARK_CONNECT_RETRY_S=str(RETRY_S),
        INGEST_METRICS_PORT="0",
        INGEST_WARM_UP_RECORDS="0",
    )
    return IngestProcess.worker(env, source, tmp_path, name)


def connect_events(worker: IngestProcess, source: str) -> dict[str, float]:
    """ingest_spark_connect_events_total by event, scraped from the worker's /metrics."""
    port = next(worker.events("metrics_serving"))["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        s.labels["event"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ingest_spark_connect_events_total" and s.labels["source"] == source
    }


def test_a_restarted_connect_server_gets_a_fresh_session_and_every_offset_once(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    connect_server: LocalConnectServer,
) -> None:
    source, produced = new_source(2, max_records=500, max_age="1s")
    produced.produce(1000)
    worker = connect_worker(tmp_path, database_url, kafka_bootstrap, connect_server, source, "restart")
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source) or worker.poll() is not None, 240, "a first publish")
            assert worker.poll() is None, worker.log_tail()
            connect_server.kill()
            # Built while the server is dead: the calls give up within RETRY_S, the builds are retried.
            produced.produce(1000)
            wait_until(
                lambda: worker.has_event("spark_connect_unreachable") or worker.poll() is not None,
                120,
                "a build to give up on the dead server",
            )
            connect_server.start()
            restarted = time.monotonic()
            produced.produce(1000)
            wait_until(
                lambda: produced.caught_up(store, source) or worker.poll() is not None,
                240,
                "the worker to publish everything on the new server",
                detail=worker.log_tail,
            )
            print(f"caught up {time.monotonic() - restarted:.1f} s after the new server listened")
        # The same process went on: no restart by anyone, a fresh session instead.
        assert worker.poll() is None, worker.log_tail()
        assert worker.has_event("spark_connect_session_recreated"), worker.log_tail()
        events = connect_events(worker, source)
        assert events["unreachable"] + events["session_lost"] >= 1, events
        assert events["session_recreated"] >= 1, events
    finally:
        worker.stop(timeout=90)
    assert worker.poll() == 0, worker.log_tail()
    assert_exactly_once(database_url, source, produced)


def test_a_sigterm_while_the_connect_server_is_dead_exits_within_the_retry_bound(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    connect_server: LocalConnectServer,
) -> None:
    source, produced = new_source(1, max_records=500, max_age="1s")
    produced.produce(500)
    worker = connect_worker(tmp_path, database_url, kafka_bootstrap, connect_server, source, "sigterm")
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source) or worker.poll() is not None, 240, "a first publish")
        assert worker.poll() is None, worker.log_tail()
        sealed = len(list(worker.events("split_sealed")))
        connect_server.kill()
        produced.produce(500)
        # A split sealed after the kill is being built: its calls are retrying the dead server.
        wait_until(
            lambda: len(list(worker.events("split_sealed"))) > sealed or worker.poll() is not None,
            60,
            "a split to seal with the server dead",
            detail=worker.log_tail,
        )
        started = time.monotonic()
        worker.signal(signal.SIGTERM)
        wait_until(lambda: worker.poll() is not None, 120, "the worker to exit", detail=worker.log_tail)
        took = time.monotonic() - started
        print(f"exited {took:.1f} s after SIGTERM with the server dead")
    finally:
        worker.stop(timeout=30)
        if connect_server.pid is None:
            connect_server.start()  # as the module found it
    assert worker.poll() == 0, worker.log_tail()
    # The client's own retries would hold the build for 10 minutes or more, and the stop for
    # the pipeline's 30 s bound on its build threads and then for the session's release. The
    # bound: a build's call (RETRY_S), the stop (RETRY_S), and the worker's own shutdown.
    assert took < 2 * RETRY_S + 17, took
