"""One worker's consumer loop wired to fakes: the in-memory broker, group member and log-end
queries, the in-memory metastore, the fake builder (reading the in-memory broker) and the real
build and publish queues, publisher, rebalance handler, registry and background thread. For
unit tests of the loop and its helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ingest.builder.queue import REGISTRY_RETRY, BuildQueue
from ingest.consume.assignment import Assignment
from ingest.consume.background import Background
from ingest.consume.context import LoopContext
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.loop import ConsumeLoop, LoopOptions
from ingest.consume.rebalance import RebalanceHandler
from ingest.ops.metrics import Metrics
from ingest.publish.publisher import Publisher
from ingest.publish.queue import PublishQueue
from ingest.spec.holder import SpecHolder
from ingest.spec.model import SourceSpec, SplitLimits
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, TopicPartition
from ingest_dev.testkit import wait_until
from tests.fake_metastore import MemoryMetastore
from tests.fakes import FakeBuilder, FakeClock
from tests.memory_kafka import MemoryBroker, MemoryConsumer, MemoryLogOffsets, MemoryValidator

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
    publish_stall_s: float = 120.0
    # The loop's clock: schedules (rewinds, retries, the rebalance deadline) run on it, and
    # ``step_until`` moves it by ``tick_s`` a step, so no test sleeps through a backoff.
    clock: FakeClock = field(default_factory=FakeClock)
    tick_s: float = 0.1

    def __post_init__(self) -> None:
        self.builder.register_with(self.store, self.worker_id)
        self.builder.clock = self.clock
        self.builder.broker = self.broker
        self.store.register_partitions("src", TOPIC, [0, 1], self.spec.start_from)
        self.consumer = MemoryConsumer(self.broker, incremental=self.incremental)
        self.offsets = MemoryLogOffsets(self.broker)
        self.validator = MemoryValidator(self.broker)
        self.assignment = Assignment()
        self.background = Background("test-background")
        self.specs = SpecHolder(self.spec, 1)
        publisher = Publisher(self.store, "src", self.worker_id, backoff=Backoff(0.01, 0.02))
        self.builds = BuildQueue(
            self.builder, threads=1, attempts=1, linger_s=0.0, registry_retry=REGISTRY_RETRY.on(self.clock)
        )
        self.publishes = PublishQueue(publisher, discard=self.builder.discard)
        self.ctx = LoopContext(
            worker_id=self.worker_id,
            specs=self.specs,
            consumer=self.consumer,
            validator=self.validator,
            assignment=self.assignment,
            killer=self.publishes,
            store=self.store,
            claims=self.store,
            background=self.background,
            metrics=self.metrics,
            clock=self.clock,
        )
        self.registry = WorkerRegistry(self.ctx, interval_s=0.0)
        self.handler = RebalanceHandler(self.ctx, watermarks=self.offsets, deadline_s=2.0)
        self.consumer.subscribe(self.spec.topics, self.handler)
        self.loop = ConsumeLoop(
            self.ctx,
            builds=self.builds,
            publishes=self.publishes,
            handler=self.handler,
            registry=self.registry,
            offsets=self.offsets,
            options=LoopOptions(
                poll_timeout_s=0.0,
                log_end_interval_s=0.0,
                drain_timeout_s=5.0,
                unhealthy_after_publish_stall_s=self.publish_stall_s,
            ),
        )

    def produce(self, tp: TopicPartition, n: int) -> None:
        self.broker.produce(tp, *(b'{"ts": 1}' for _ in range(n)))

    def step_until(self, done: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
        def tick() -> None:
            self.clock.advance(self.tick_s)
            self.loop.step()

        wait_until(lambda: done() or tick(), timeout_s, what, interval=0.002)

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
        self.publishes.close(timeout=5)
        self.builds.close(timeout=5)
        self.publishes.stop(timeout=5)
        self.background.close()


class NothingInFlight:
    """Nothing in flight, for parts tested without the stages."""

    def kill(self, tps: Iterable[TopicPartition], reason: KillReason, within_s: float | None = None) -> int:
        return 0


def context(store: MemoryMetastore, background: Background, *, worker_id: str = "w1", **fields: Any) -> LoopContext:
    """A loop context over ``store`` and ``background`` without a loop (a consumer on an empty
    in-memory broker, nothing owned, nothing in flight); ``fields`` replace any of its parts."""
    parts: dict[str, Any] = {
        "worker_id": worker_id,
        "specs": SpecHolder(spec(), 1),
        "consumer": MemoryConsumer(MemoryBroker()),
        "validator": MemoryValidator(MemoryBroker()),
        "assignment": Assignment(),
        "killer": NothingInFlight(),
        "store": store,
        "claims": store,
        "background": background,
        "metrics": Metrics("src"),
    }
    return LoopContext(**(parts | fields))
