"""Helpers for end-to-end tests: specs, sample data, in-process and out-of-process workers."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ingest.builder.job import BuilderFactory
from ingest.config import Settings
from ingest.spec.evolution import evolution_guard
from ingest.spec.parse import load_spec_file, resolve_registry_schema
from ingest.worker import Worker
from ingest_dev.kafka_clients import produce_records
from ingest_dev.verify import Verification, published_positions, verify_exactly_once
from metastore import Metastore

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {"id": "long", "user": "string", "ts": "timestamp", "amount": "double", "tags": "array<string>"}


def write_spec(
    tmp_path: Path,
    topic: str,
    *,
    name: str | None = None,
    max_records: int = 5000,
    max_age: str = "1s",
    on_parse_error: str = "reject",
    extra: str = "",
    store: str | None = None,
) -> tuple[str, Path]:
    name = name or "s" + uuid.uuid4().hex[:8]
    path = tmp_path / f"{name}.toml"
    schema = "\n".join(f'{k} = "{v}"' for k, v in SCHEMA.items())
    path.write_text(
        f'name = "{name}"\ntopics = ["{topic}"]\nevent_time = "ts"\n'
        f'segment_store = "{store or tmp_path / "store"}"\non_parse_error = "{on_parse_error}"\n{extra}\n'
        f'[schema]\n{schema}\n\n[split]\nmax_records = {max_records}\nmax_age = "{max_age}"\n'
    )
    return name, path


def apply_spec(database_url: str, path: Path) -> None:
    spec, text = load_spec_file(path)
    spec = resolve_registry_schema(spec)  # as ``ingest source apply`` does
    with Metastore(database_url) as store:
        store.apply_source(spec.name, spec.to_json(), text, follows=evolution_guard(spec))


def sample_value(i: int) -> bytes:
    return json.dumps(
        {
            "id": i,
            "user": f"user-{i % 97}",
            "ts": f"2026-11-22T10:{(i // 60) % 60:02d}:{i % 60:02d}Z",
            "amount": i * 0.5,
            "tags": ["a", str(i % 7)],
        }
    ).encode()


class Produced:
    """Everything produced to one topic so far, from the producer's delivery reports."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.ends: dict[int, int] = {p: 0 for p in range(partitions)}
        self.next_id = 0

    def produce(self, n: int, values: Callable[[int], bytes | None] = sample_value) -> None:
        first = self.next_id
        records = ((i % self.partitions, str(i).encode(), values(i)) for i in range(first, first + n))
        ends = produce_records(self.bootstrap, self.topic, records)
        for p, end in ends.items():
            self.ends[p] = max(self.ends[p], end)
        self.next_id += n

    def expected(self) -> dict[tuple[str, int], list[int]]:
        return {(self.topic, p): list(range(end)) for p, end in self.ends.items()}

    def caught_up(self, store: Metastore, source: str) -> bool:
        positions = published_positions(store, source)
        return all(positions.get((self.topic, p)) == end for p, end in self.ends.items() if end)


class NewSource(Protocol):
    """The ``new_source`` fixture: ``new_source(partitions, **write_spec options) -> (source,
    produced)``: a new topic of ``partitions``, a JSON source over it applied to the metastore,
    and the :class:`Produced` that tracks what the test produces to it."""

    def __call__(self, partitions: int, **spec: Any) -> tuple[str, Produced]: ...


def settings(database_url: str, bootstrap: str, **over: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap": bootstrap,
        "kafka_properties": {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
        "worker_id": "w-" + uuid.uuid4().hex[:6],
    }
    base.update(over)
    return Settings(**base)


class ThreadWorker:
    """A Worker running in a thread of the test process, sharing the test's SparkSession."""

    def __init__(self, settings: Settings, source: str, builder: BuilderFactory) -> None:
        self.worker = Worker(settings, source, builder_factory=builder)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"worker-{settings.worker_id}", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run(self.stop_event)
        except BaseException as exc:
            self.error = exc

    def start(self) -> ThreadWorker:
        self.thread.start()
        assert self.worker.ready.wait(30) or self.error is None, self.error
        return self

    def stop(self, timeout: float = 90) -> None:
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"

    def consumed(self) -> float:
        return self.worker.metrics.records_consumed.labels(self.worker.source)._value.get()  # type: ignore[no-any-return]


StartWorker = Callable[[Settings, str, BuilderFactory], ThreadWorker]


# The consumer group protocols a worker supports: the classic one (the default) and KIP-848's.
GROUP_PROTOCOLS = ("classic", "consumer")


def process_env(database_url: str, bootstrap: str, group_protocol: str = "classic", **extra: str) -> dict[str, str]:
    """A worker process's environment. Under ``group_protocol="consumer"`` the session timeout
    and heartbeat are the broker's (``group.consumer.*``; the test broker uses 6 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env.update(
        {
            "INGEST_DATABASE_URL": database_url,
            "INGEST_KAFKA_BOOTSTRAP": bootstrap,
            "INGEST_SPARK_MASTER": "local[1]",
            "INGEST_SPARK_DRIVER_MEMORY": "512m",
            "INGEST_BUILD_THREADS": "1",
            "INGEST_LOG_FORMAT": "json",
            "PYTHONPATH": str(REPO),
        }
    )
    if group_protocol == "consumer":
        env["INGEST_KAFKA_PROP_GROUP_PROTOCOL"] = "consumer"
    else:
        env["INGEST_KAFKA_PROP_SESSION_TIMEOUT_MS"] = "6000"
        env["INGEST_KAFKA_PROP_HEARTBEAT_INTERVAL_MS"] = "500"
    env.update(extra)
    return env


def kafka_prop_env(props: Mapping[str, str]) -> dict[str, str]:
    """Librdkafka properties as a worker process reads them (``INGEST_KAFKA_PROP_<NAME>``)."""
    return {"INGEST_KAFKA_PROP_" + name.upper().replace(".", "_"): value for name, value in props.items()}


def showing(secret: str, texts: Mapping[str, str]) -> list[str]:
    """Which of ``texts`` (what a process showed, by where it showed it: a log, a scrape, an
    output) show ``secret``; a secret handled right shows in none."""
    return [where for where, text in texts.items() if secret in text]


def assert_exactly_once(database_url: str, source: str, produced: Produced) -> Verification:
    with Metastore(database_url) as store:
        result = verify_exactly_once(store, source, produced.expected())
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    return result
