"""The build and publish stages chained as the consumer loop chains them (ingest.consume.loop:
each split to the build queue, its future to the publish queue), for the unit tests of the two
stages together."""

from __future__ import annotations

from collections.abc import Iterable

from ingest.builder.job import SegmentBuilder
from ingest.builder.queue import BUILD_RETRY, REGISTRY_RETRY, BuildQueue
from ingest.builder.registry_wait import RegistryWait
from ingest.publish.publisher import Publisher
from ingest.publish.queue import PublishQueue
from ingest.publish.settle import Discard, Outcome
from ingest.spec.holder import SpecHolder
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, TopicPartition


class Stages:
    def __init__(
        self,
        builder: SegmentBuilder,
        publisher: Publisher,
        specs: SpecHolder,
        *,
        build_threads: int = 2,
        max_batch_splits: int = 8,
        batch_linger_s: float = 0.5,
        build_attempts: int = 3,
        build_retry: Backoff = BUILD_RETRY,
        registry_retry: Backoff = REGISTRY_RETRY,
        discard: Discard | None = None,
    ) -> None:
        self.specs = specs
        self.builds = BuildQueue(
            builder,
            threads=build_threads,
            max_batch_splits=max_batch_splits,
            linger_s=batch_linger_s,
            attempts=build_attempts,
            retry=build_retry,
            registry_retry=registry_retry,
        )
        # The fake builder records what it is given to delete.
        self.publishes = PublishQueue(publisher, discard=discard or getattr(builder, "discard", None))

    def submit(self, split: SealedSplit) -> None:
        spec, version = self.specs.current()
        self.publishes.submit(split, self.builds.submit(split, spec), version)

    def kill(self, tps: Iterable[TopicPartition], reason: KillReason, within_s: float | None = None) -> int:
        return self.publishes.kill(tps, reason, within_s)

    def kill_all(self, reason: KillReason, within_s: float | None = None) -> int:
        return self.publishes.kill_all(reason, within_s)

    def poll(self) -> list[Outcome]:
        return self.publishes.poll()

    def join(self, timeout: float) -> bool:
        return self.publishes.join(timeout)

    @property
    def inflight_count(self) -> int:
        return self.publishes.inflight_count

    @property
    def inflight_bytes(self) -> int:
        return self.publishes.inflight_bytes

    @property
    def registry_wait(self) -> RegistryWait | None:
        return self.builds.registry_wait

    def close(self, timeout: float = 30.0) -> None:
        self.publishes.close(timeout)
        self.builds.close(timeout)
        self.publishes.stop(timeout)
