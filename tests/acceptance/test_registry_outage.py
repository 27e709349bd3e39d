"""A schema registry outage mid-run, against the real registry (Apicurio), Kafka, Spark and
PostgreSQL: a partition whose records carry a writer schema id the worker never fetched
waits (paused, nothing rejected, skipped or published past it) and says so in /readyz,
`ingest status` and the metrics, while a partition whose ids are cached goes on publishing;
the worker stays alive, and once the registry is back the waiting partition resumes by
itself and every record lands exactly once, with no reject."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.job import BuilderFactory
from ingest.ops.status import source_status
from ingest.ops.status_text import render
from ingest_dev.registry import LocalSchemaRegistry
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import Produced, StartWorker, ThreadWorker, apply_spec, assert_exactly_once, settings
from tests.acceptance.test_registry_formats import V1, V2, order, serializer, write_registry_spec
from tests.fixtures.servers import MakeTopic


def get(worker: ThreadWorker, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{worker.worker.metrics_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(worker: ThreadWorker, name: str, source: str) -> float | None:
    for line in get(worker, "/metrics")[1].splitlines():
        if line.startswith(f'{name}{{source="{source}"}} '):
            return float(line.split()[-1])
    return None


def test_a_registry_outage_pauses_the_partitions_it_holds_up_and_loses_or_rejects_nothing(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    private_schema_registry: LocalSchemaRegistry,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    registry = private_schema_registry
    topic = make_topic(partitions=2)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produced = Produced(kafka_bootstrap, topic, 2)
    v1, v2 = serializer(registry.url, V1), serializer(registry.url, V2)
    # Record i goes to partition i % 2. Both writer schemas are registered now; the worker
    # meets v2's id only during the outage, on partition 1.
    during = {i: (v2({**order(i), "region": "us"}, ctx) if i % 2 else v1(order(i), ctx)) for i in range(200, 400)}
    produced.produce(200, lambda i: v1(order(i), ctx))
    source, spec_path = write_registry_spec(
        tmp_path, topic, registry.url, 'format = "avro"\n[schema]\nid = "long"\nts = "timestamp"\nregion = "string"\n'
    )
    apply_spec(database_url, spec_path)
    worker = start_worker(settings(database_url, kafka_bootstrap, metrics_port=0), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 240, "the records before the outage")
        assert metric(worker, "ingest_schema_registry_up", source) == 1

        registry.halt()
        before = dict(produced.ends)
        produced.produce(200, lambda i: during[i])
        topic_p0, topic_p1 = (topic, 0), (topic, 1)

        def positions() -> dict[tuple[str, int], int | None]:
            return {(r["topic"], r["partition"]): r["next_offset"] for r in store.partitions(source)}

        # Partition 0 holds only v1 (cached): it publishes through the outage.
        wait_until(lambda: positions()[topic_p0] == produced.ends[0], 240, "partition 0 to publish in the outage")
        wait_until(lambda: get(worker, "/readyz")[0] == 503, 120, "/readyz to say the worker waits")
        code, body = get(worker, "/readyz")
        assert code == 503 and "schema registry" in body and f"{topic}[1]" in body and f"{topic}[0]" not in body, body
        assert get(worker, "/healthz")[0] == 200  # alive: a registry outage is no reason to restart it
        assert metric(worker, "ingest_schema_registry_up", source) == 0
        assert metric(worker, "ingest_schema_registry_waiting_partitions", source) == 1

        def waiting_status() -> dict[str, Any] | None:
            doc = source_status(store, worker.worker.settings, source)
            return doc if doc["detailed_state"] == "SCHEMA_REGISTRY_UNAVAILABLE" else None

        wait_until(lambda: waiting_status() is not None, 30, "ingest status to show the wait")
        doc = waiting_status()
        assert doc is not None
        states = {p["partition"]: p["state"] for p in doc["partitions"]}
        assert states == {0: "OK", 1: "WAITING_FOR_SCHEMA_REGISTRY"}, states
        text = "\n".join(render(doc))
        assert f"partition {topic}[1]: WAITING_FOR_SCHEMA_REGISTRY" in text, text
        assert any(e["kind"] == "SCHEMA_REGISTRY_UNAVAILABLE" for e in doc["recent_errors"])
        # Nothing of partition 1 past what was built before the outage, and no failure counted.
        assert positions()[topic_p1] == before[1]
        assert worker.worker.metrics.split_failures.labels(source, "build")._value.get() == 0
        assert worker.error is None and worker.thread.is_alive()

        registry.start()
        wait_until(lambda: produced.caught_up(store, source), 240, "the waiting partition to resume by itself")
        wait_until(lambda: get(worker, "/readyz")[0] == 200, 30, "/readyz ready again")
        assert metric(worker, "ingest_schema_registry_up", source) == 1
        wait_until(lambda: waiting_status() is None, 30, "ingest status without the wait (the next heartbeat)")
    worker.stop()
    assert worker.error is None
    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (400, 0)
    assert worker.worker.metrics.split_failures.labels(source, "build")._value.get() == 0
