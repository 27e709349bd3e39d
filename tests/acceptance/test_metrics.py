"""Metrics scraped from running workers, checked against what the metastore says was published;
and a real Prometheus scraping two workers."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ingest.builder.job import BuilderFactory
from ingest.ops.status import source_status
from ingest_common.model import PARSE_ERRORS, WorkerState
from ingest_dev.process import popen
from ingest_dev.testkit import free_port, wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    NewSource,
    Produced,
    StartWorker,
    ThreadWorker,
    apply_spec,
    settings,
    write_spec,
)

WORKER_STATES = [s.value for s in WorkerState]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(worker: ThreadWorker) -> Samples:
    port = worker.worker.metrics_port
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def partitions_with(samples: Samples, name: str) -> set[str]:
    return {dict(labels)["partition"] for (n, labels) in samples if n == name}


def test_metrics_match_what_was_published_and_follow_rebalances(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(4, max_records=400)
    topic = produced.topic
    produced.produce(
        3000, lambda i: b"{not json" if i % 100 == 0 else json.dumps({"id": i, "ts": "2026-11-22T10:00:00Z"}).encode()
    )
    first = start_worker(settings(database_url, kafka_bootstrap, metrics_port=0), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to catch up")
        segments = store.segments(source)
    wait_until(
        lambda: value(scrape(first), "ingest_segments_published_total", source=source) == len(segments),
        10,
        "the last outcome to be counted",
    )
    m = scrape(first)
    assert value(m, "ingest_records_consumed_total", source=source) == 3000
    assert value(m, "ingest_records_published_total", source=source) == sum(s["row_count"] for s in segments) == 2970
    # By reason: every reason is exported from the start, only the one that happened counts.
    assert value(m, "ingest_records_rejected_total", source=source, reason="invalid_json") == 30
    for reason in PARSE_ERRORS[1:]:
        assert value(m, "ingest_records_rejected_total", source=source, reason=reason) == 0
        assert value(m, "ingest_records_skipped_total", source=source, reason=reason) == 0
    assert value(m, "ingest_publish_transaction_seconds_count", source=source) == len(segments)
    assert value(m, "ingest_segment_rows_sum", source=source) == 2970
    assert value(m, "ingest_assigned_partitions", source=source) == 4
    assert value(m, "ingest_worker_up", source=source) == 1
    assert {dict(labels)["state"]: v for (n, labels), v in m.items() if n == "ingest_worker_state"} == {
        s: float(s == "running") for s in WORKER_STATES
    }
    assert value(m, "ingest_rebalances_total", source=source, kind="assign") == 1
    for p, end in produced.ends.items():
        assert value(m, "ingest_partition_next_offset", source=source, topic=topic, partition=str(p)) == end

    # Lag gauges refresh once a second (the record lag once a fetch response has told the consumer
    # the high watermark): nothing is pending, so both drop to 0 on every partition.
    def lag_is_zero() -> bool:
        now = scrape(first)
        return all(
            now.get((name, tuple(sorted({"source": source, "topic": topic, "partition": str(p)}.items())))) == 0
            for p in range(4)
            for name in ("ingest_partition_lag_seconds", "ingest_partition_lag_records")
        )

    wait_until(lag_is_zero, 5, "record lag and lag age to drop to 0 on every partition")
    with Metastore(database_url) as store:
        status = source_status(store, first.worker.settings, source)
    assert status["state"] in ("IDLE", "RUNNING"), status["state"]
    assert [(w["worker"], w["state"], len(w["partitions"])) for w in status["workers"]] == [
        (first.worker.settings.worker_id, "running", 4)
    ]
    assert status["recent_errors"] == []
    for path, body in (("/healthz", "last poll"), ("/readyz", "4 partition(s) assigned")):
        with urllib.request.urlopen(f"http://127.0.0.1:{first.worker.metrics_port}{path}", timeout=5) as resp:
            assert resp.status == 200 and body in resp.read().decode()

    second = start_worker(settings(database_url, kafka_bootstrap, metrics_port=0), source, spark_builder)
    wait_until(lambda: 0 < len(first.worker.assignment) < 4 and len(second.worker.assignment) > 0, 90, "a rebalance")
    owned = {str(o.tp.partition) for o in first.worker.assignment}
    m = scrape(first)
    assert value(m, "ingest_assigned_partitions", source=source) == len(owned)
    # Series of partitions that moved away are gone, not frozen at their last value.
    for name in ("ingest_partition_next_offset", "ingest_partition_lag_records", "ingest_partition_lag_seconds"):
        assert partitions_with(m, name) <= owned, name
    assert value(m, "ingest_rebalances_total", source=source, kind="revoke") >= 1
    first.stop()
    states = {s: first.worker.metrics.worker_state.labels(source, s)._value.get() for s in WORKER_STATES}
    assert states == {s: float(s == "stopped") for s in WORKER_STATES}


def test_a_real_prometheus_scrapes_two_workers(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (scripts/setup.sh installs Debian's prometheus package)"
    topic = make_topic(partitions=2)
    source, spec_path = write_spec(tmp_path, topic, max_records=100)
    apply_spec(database_url, spec_path)
    Produced(kafka_bootstrap, topic, 2).produce(200)
    workers = [
        start_worker(settings(database_url, kafka_bootstrap, metrics_port=0), source, spark_builder) for _ in range(2)
    ]
    targets = [f"127.0.0.1:{w.worker.metrics_port}" for w in workers]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: ingest\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def instances() -> set[str]:
            url = f"http://127.0.0.1:{port}/api/v1/query?query=ingest_worker_up%3D%3D1"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    body = json.load(resp)
            except OSError:
                return set()
            return {r["metric"]["instance"] for r in body["data"]["result"]}

        wait_until(lambda: instances() == set(targets), 60, "Prometheus to scrape both workers", interval=1)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
