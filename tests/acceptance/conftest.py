from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.builder.job import BuilderFactory, SparkSegmentBuilder
from ingest.builder.writer_schemas import WriterSchemas
from ingest.config import Settings
from ingest_dev.ingest_process import kill_leftovers
from tests.acceptance.harness import NewSource, Produced, StartWorker, ThreadWorker, apply_spec, write_spec
from tests.fixtures.servers import MakeTopic

# How long an id the registry answers 404 for is waited for before its records are rejects
# (INGEST_SCHEMA_ID_WAIT_S, 60 s by default): the tests that produce ids no registry has wait
# this long instead, in real time. The wait itself, an id served after its first 404:
# tests/integration/test_writer_schema_ids.py.
SCHEMA_ID_WAIT_S = 3.0


@pytest.fixture
def spark_builder(spark: Any) -> BuilderFactory:
    return lambda registrar, reader: SparkSegmentBuilder(
        spark, registrar, reader, writer_schemas=WriterSchemas(wait_s=SCHEMA_ID_WAIT_S)
    )


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    """Worker and committer processes a test left running (it failed before its stops) are
    killed with their groups: they would outlive the servers and load the machine."""
    yield
    kill_leftovers()


@pytest.fixture
def start_worker() -> Iterator[StartWorker]:
    """Start in-process workers that are always stopped at teardown, even when the test
    failed half-way (a worker left running would outlive the servers and the SparkSession)."""
    started: list[ThreadWorker] = []

    def start(settings: Settings, source: str, builder: BuilderFactory) -> ThreadWorker:
        worker = ThreadWorker(settings, source, builder)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop_event.set()
    for worker in started:
        worker.thread.join(60)


@pytest.fixture
def new_source(tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic) -> NewSource:
    """What most tests start with: a new topic, a JSON source over it (tests.acceptance.harness.write_spec's
    options) applied to the metastore, and the :class:`Produced` of that topic."""

    def make(partitions: int, **spec: Any) -> tuple[str, Produced]:
        topic = make_topic(partitions=partitions)
        source, path = write_spec(tmp_path, topic, **spec)
        apply_spec(database_url, path)
        return source, Produced(kafka_bootstrap, topic, partitions)

    return make
