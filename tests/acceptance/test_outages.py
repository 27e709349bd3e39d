"""Faults of the servers around a running worker: nothing lost, nothing published twice."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ingest.builder.job import BuilderFactory
from ingest_dev.postgres import LocalPostgres
from ingest_dev.testkit import wait_until
from metastore import Metastore, apply_migrations
from tests.acceptance.harness import (
    Produced,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    settings,
    write_spec,
)


@pytest.fixture
def own_postgres() -> Iterator[LocalPostgres]:
    """A PostgreSQL of this test's own, so that it can be taken down."""
    with LocalPostgres() as pg:
        apply_migrations(pg.url)
        yield pg


def test_a_postgres_outage_is_ridden_out_without_loss_or_duplicates(
    tmp_path: Path,
    own_postgres: LocalPostgres,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    url = own_postgres.url
    topic = make_topic(partitions=3)
    source, spec_path = write_spec(tmp_path, topic, max_records=500, max_age="500ms")
    apply_spec(url, spec_path)
    produced = Produced(kafka_bootstrap, topic, 3)
    produced.produce(3000)
    worker = start_worker(settings(url, kafka_bootstrap), source, spark_builder)
    with Metastore(url) as store:
        wait_until(lambda: len(store.segments(source)) >= 1, 60, "a first segment")
    outage = threading.Thread(target=own_postgres.outage, args=(8.0,))
    outage.start()
    produced.produce(3000)  # consumed, built and held while PostgreSQL is down
    outage.join(60)
    with Metastore(url) as store:
        wait_until(lambda: produced.caught_up(store, source), 120, "the worker to catch up after the outage")
    assert worker.error is None and worker.thread.is_alive()
    metrics = worker.worker.metrics
    assert metrics.metastore_errors.labels(source)._value.get() > 0  # the outage was really seen
    worker.stop()
    assert_exactly_once(url, source, produced)
