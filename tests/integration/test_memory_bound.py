"""A worker holds no records: its group member's partitions stay paused (Spark reads the
records from Kafka) and a split is a range of offsets. So the worker process's own memory
(the Python process; its Spark JVM is a child of its own) stays flat while the backlog of the
partitions it owns grows by a hundred MB and more. A worker process, the real broker,
PostgreSQL and a local Spark."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from bench.procs import read_stat
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.testkit import wait_until
from ingest_dev.verify import published_positions
from metastore import Metastore
from tests.acceptance.harness import Produced, apply_spec, process_env, sample_value, write_spec
from tests.fixtures.servers import MakeTopic

pytestmark = pytest.mark.process

# ~300-byte records: ~145 MB of backlog.
BACKLOG_RECORDS = 500_000
PADDING = "x" * 200
# What the worker's RSS may grow by meanwhile (allocator noise, a few splits' bookkeeping).
GROWTH_BOUND = 32 * 2**20


def padded(i: int) -> bytes:
    return json.dumps({**json.loads(sample_value(i)), "note": PADDING}).encode()


def test_a_workers_memory_stays_flat_while_its_backlog_grows(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=2)
    source, path = write_spec(tmp_path, topic, max_records=50_000, max_age="1s")
    apply_spec(database_url, path)
    produced = Produced(kafka_bootstrap, topic, 2)
    produced.produce(4000, padded)  # the worker's first builds (its JVM, its plans) come before the baseline
    worker = IngestProcess.worker(process_env(database_url, kafka_bootstrap), source, tmp_path, "mem")
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            stat = read_stat(pid)
            if stat is not None:
                samples.append(stat.rss_bytes)

    try:
        with Metastore(database_url) as store:
            wait_until(
                lambda: produced.caught_up(store, source) or worker.poll() is not None,
                180,
                "the worker to publish the first records",
            )
            assert worker.poll() is None, worker.log_path.read_text()[-3000:]
            assert worker.pid is not None
            pid = worker.pid
            baseline = max(s.rss_bytes for s in (read_stat(pid) for _ in range(5)) if s is not None)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            produced.produce(BACKLOG_RECORDS, padded)
            # The worker cuts and builds from the backlog for a while: it published some of it.
            behind = sum(produced.ends.values()) - sum(published_positions(store, source).values())
            time.sleep(2)
            sampling.set()
            sampler.join(5)
            published = sum(published_positions(store, source).values())
    finally:
        worker.kill()  # what it leaves unpublished does not matter here (its JVM exits with it)
    growth = max(samples) - baseline
    print(
        f"worker RSS {baseline / 2**20:.0f} MB, peak {max(samples) / 2**20:.0f} MB over {len(samples)} samples;"
        f" backlog {behind} records ({behind * len(padded(0)) / 2**20:.0f} MB) after the produce,"
        f" {published - 4000} of them published by the end"
    )
    assert behind * len(padded(0)) > 2 * GROWTH_BOUND, behind
    assert published > 4000, "the worker built nothing from the backlog"
    assert growth < GROWTH_BOUND, f"the worker's RSS grew {growth / 2**20:.0f} MB"
