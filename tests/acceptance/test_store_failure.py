"""An unwritable segment store under load: the worker reports itself unhealthy with the
cause, offsets never move past unpublished data, and it recovers when the store does."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.builder.job import BuilderFactory
from ingest.cli import main as cli_main
from ingest.ops.status import source_status
from ingest_dev.testkit import wait_until
from ingest_dev.verify import published_positions
from metastore import Metastore
from tests.acceptance.harness import (
    Produced,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    settings,
    write_spec,
)


def _probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_failing_builds_make_the_worker_unhealthy_until_the_store_is_writable_again(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = database_url
    topic = make_topic(partitions=3)
    source, spec_path = write_spec(tmp_path, topic, max_records=300, max_age="500ms")
    apply_spec(url, spec_path)
    produced = Produced(kafka_bootstrap, topic, 3)
    produced.produce(900)
    conf = settings(url, kafka_bootstrap, metrics_port=0, unhealthy_after_failed_splits=2)
    worker = start_worker(conf, source, spark_builder)
    with Metastore(url) as store:
        wait_until(lambda: produced.caught_up(store, source), 120, "the first records")
        before = published_positions(store, source)
    port = worker.worker.metrics_port
    assert port is not None and _probe(port, "/readyz")[0] == 200

    # The store becomes a regular file: every write under it fails, even as root (chmod
    # would not stop root). Records keep arriving meanwhile.
    store_dir = tmp_path / "store"
    store_dir.rename(tmp_path / "store.away")
    store_dir.write_text("not a directory")
    produced.produce(900)
    wait_until(lambda: not worker.worker.healthy()[0], 180, "the worker to report itself unhealthy")
    _ok, reason = worker.worker.healthy()
    assert "splits failed in a row" in reason and "not a directory" in reason.lower(), reason
    healthz, ready = _probe(port, "/healthz"), _probe(port, "/readyz")
    assert healthz[0] == 503 and "splits failed" in healthz[1]
    assert ready[0] == 503
    with Metastore(url) as store:
        assert published_positions(store, source) == before  # nothing published, nothing skipped
        wait_until(
            lambda: source_status(store, conf, source)["detailed_state"] == "SPLITS_FAILING",
            30,
            "the registry to show the unhealthy worker",
        )
        status = source_status(store, conf, source)
    assert status["state"] == "UNHEALTHY"
    assert any(
        e["kind"] == "BUILD_FAILED" and "not a directory" in e["message"].lower() for e in status["recent_errors"]
    )
    monkeypatch.setenv("INGEST_DATABASE_URL", url)
    monkeypatch.setenv("INGEST_KAFKA_BOOTSTRAP", kafka_bootstrap)
    capsys.readouterr()
    assert cli_main(["health", source]) == 1
    assert "unhealthy (UNHEALTHY, SPLITS_FAILING)" in capsys.readouterr().out

    # The store comes back: the partitions re-read from the stored offsets and publish.
    store_dir.unlink()
    (tmp_path / "store.away").rename(store_dir)
    with Metastore(url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up after the store returned")
    # Healthy again once the loop has taken the publish outcomes (just after their commits).
    wait_until(lambda: worker.worker.healthy()[0], 30, "the worker to report itself healthy again")
    assert _probe(port, "/readyz")[0] == 200
    assert worker.error is None and worker.thread.is_alive()
    assert worker.worker.metrics.split_failures.labels(source, "build")._value.get() >= 2
    worker.stop()
    assert_exactly_once(url, source, produced)
