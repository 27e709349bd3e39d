"""One worker's consumer loop wired to fakes: the in-memory broker and consumer, the
in-memory metastore, the fake builder and the real pipeline, publisher, rebalance handler,
registry and background thread. For unit tests of the loop and its helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ingest.backoff import Backoff
from ingest.consume.assignment import Assignment
from ingest.consume.background import Background
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.loop import ConsumeLoop, LoopOptions
from ingest.consume.rebalance import RebalanceHandler
from ingest.ops.metrics import Metrics
from ingest.publish.pipeline import Pipeline
from ingest.publish.publisher import Publisher
from ingest.spec import SourceSpec, SplitLimits
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.fakes import FakeBuilder, MemoryMetastore
from tests.memory_kafka import MemoryBroker, MemoryConsumer

TOPIC = "t"
P0 = TopicPartition(TOPIC, 0)
P1 = TopicPartition(TOPIC, 1)


def spec(**overrides: object) -> SourceSpec:
    fields: dict[str, object] = {
        "name": "src",
        "topics": (TOPIC,),
        "schema": (("ts", "timestamp"),),
        "event_time": "ts",
        "segment_store": "file:///tmp/unused",
        "split": SplitLimits(max_records=10, max_age_s=60.0),
    }
    return SourceSpec(**(fields | overrides))  # type: ignore[arg-type]


@dataclass
class Harness:
    spec: SourceSpec = field(default_factory=spec)
    worker_id: str = "w1"
    incremental: bool = True
    broker: MemoryBroker = field(default_factory=MemoryBroker)
    store: MemoryMetastore = field(default_factory=MemoryMetastore)
    builder: FakeBuilder = field(default_factory=FakeBuilder)
    metrics: Metrics = field(default_factory=lambda: Metrics("src"))

    def __post_init__(self) -> None:
        self.builder.register_with(self.store, self.worker_id)
        self.store.register_partitions("src", TOPIC, [0, 1], self.spec.start_from)
        self.consumer = MemoryConsumer(self.broker, incremental=self.incremental)
        self.assignment = Assignment()
        self.background = Background("test-background")
        self.registry = WorkerRegistry(self.store, "src", self.worker_id, self.background, interval_s=0.0)
        publisher = Publisher(self.store, "src", self.worker_id, backoff=Backoff(0.01, 0.02))
        self.pipeline = Pipeline(
            self.builder, publisher, self.spec, 1, build_threads=1, build_attempts=1, batch_linger_s=0.0
        )
        self.handler = RebalanceHandler(
            source="src",
            worker_id=self.worker_id,
            store=self.store,
            assignment=self.assignment,
            pipeline=self.pipeline,
            metrics=self.metrics,
            deadline_s=2.0,
            claim_retry_s=0.01,
        )
        self.consumer.subscribe(self.spec.topics, self.handler)
        self.loop = ConsumeLoop(
            consumer=self.consumer,
            spec=self.spec,
            spec_version=1,
            worker_id=self.worker_id,
            assignment=self.assignment,
            pipeline=self.pipeline,
            handler=self.handler,
            store=self.store,
            registry=self.registry,
            background=self.background,
            metrics=self.metrics,
            watermarks=self.consumer,
            options=LoopOptions(batch_size=100, poll_timeout_s=0.0, drain_timeout_s=5.0),
        )

    def produce(self, tp: TopicPartition, n: int) -> None:
        self.broker.produce(tp, *(b'{"ts": 1}' for _ in range(n)))

    def step_until(self, done: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
        wait_until(lambda: done() or self.loop.step(), timeout_s, what, interval=0.002)

    def published(self, tp: TopicPartition) -> list[tuple[int, int]]:
        """The offset ranges of ``tp`` published so far, in publish order."""
        with self.store.lock:
            return [
                (r.range.start, r.range.end)
                for item in self.store.segments.values()
                for r in item.ranges
                if r.range.tp == tp
            ]

    def close(self) -> None:
        self.pipeline.close(timeout=5)
        self.background.close()
