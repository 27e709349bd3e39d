"""Fakes for unit tests: a clock, sealed splits, the builder and a registrar that records its
builds (the metastore in memory: tests/fake_metastore.py; Kafka in memory: tests/memory_kafka.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from ingest.builder.registration import BuildRegistrar, Registrar, RegistrationStore
from ingest.builder.writer_schemas import RegistryUnavailable
from ingest.errors import BuildError, SplitKilled
from ingest.spec.model import SourceSpec
from ingest.splits.kill_switch import KillSwitch
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    TopicPartition,
)
from tests.memory_kafka import DataLoss, MemoryBroker


class FakeClock:
    """A clock whose time moves only when told to: ``sleep`` returns at once, having moved it
    (and recorded the delay); ``advance`` moves it. Safe to share between threads."""

    def __init__(self, now: float = 1000.0, on_sleep: Callable[[float], None] | None = None) -> None:
        self._now = now
        self._lock = threading.Lock()
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._now += max(0.0, seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def make_split(
    tp: TopicPartition, start: int, end: int, serial: int = 1, epoch: int = 0, leader_epoch: int | None = 0
) -> SealedSplit:
    return SealedSplit(
        id=uuid.uuid4(),
        tp=tp,
        serial=serial,
        start=start,
        end=end,
        leader_epoch=leader_epoch,
        estimated_bytes=10 * (end - start),
        available_at=0.0,
        sealed_at=0.0,
        seal_reason="test",
        kill_switch=KillSwitch(),
        epoch=epoch,
    )


class FakeBuilder:
    """Builds instantly unless a gate is set for a split's start offset; can fail N times.

    With a ``broker`` (tests.memory_kafka), a build reads the split's records from it as Spark
    reads them from Kafka: what a read_committed reader gets of the range, and a BuildError when
    offsets of the range are gone (Spark's failOnDataLoss). Without one, every offset is a record.

    Like the real builder, a batch's live splits are registered before anything is built,
    through its registrar (a worker's, or the one :meth:`register_with` makes): the fake
    metastores refuse to publish a split with files that no build registered, as PostgreSQL
    does. Without a registrar nothing is registered, and every publish of its segments is
    refused.

    A schema registry outage: while ``registry_down`` is set, a split in ``needs_registry`` (by
    partition and start offset: it holds a writer schema id not fetched yet) is not built and
    gets RegistryUnavailable, as the real builder gives it; each such refusal is recorded in
    ``refused`` (start offset, ``clock`` time).
    """

    def __init__(
        self,
        registrar: BuildRegistrar | None = None,
        clock: FakeClock | None = None,
        broker: MemoryBroker | None = None,
    ) -> None:
        self.broker = broker
        self.gates: dict[int, threading.Event] = {}
        self.failures: dict[int, int] = {}
        # By start offset: a split whose build fails its whole batch (as one Spark job fails), N times.
        self.batch_failures: dict[int, int] = {}
        # Start offsets of the splits whose build began (reached its gate, if any), in order.
        self.started: list[int] = []
        self.built: list[SealedSplit] = []
        self.discarded: list[uuid.UUID] = []
        self.batches: list[list[int]] = []
        self.registrar = registrar
        self.lock = threading.Lock()
        self.clock = clock or FakeClock()
        self.registry_down = False
        self.needs_registry: set[tuple[TopicPartition, int]] = set()
        self.refused: list[tuple[int, float]] = []

    def register_with(self, store: RegistrationStore, worker_id: str = "w1") -> FakeBuilder:
        """Register every build in ``store`` first, as a worker's builder does."""
        self.registrar = Registrar(store, worker_id, backoff=Backoff(0.01, 0.05))
        return self

    def _build_one(self, split: SealedSplit) -> BuiltSegment:
        with self.lock:
            self.started.append(split.start)
        gate = self.gates.get(split.start)
        if gate is not None:
            while not gate.wait(0.01):
                split.kill_switch.check()
        split.kill_switch.check()
        with self.lock:
            if self.failures.get(split.start, 0) > 0:
                self.failures[split.start] -= 1
                raise BuildError("injected build failure")
        rows, record_bytes = split.offsets, 0
        if self.broker is not None:
            try:
                records = self.broker.read(split.tp, split.start, split.end)
            except DataLoss as exc:
                raise BuildError(f"Spark's reader: {exc}") from exc
            rows = len(records)
            record_bytes = sum(len(r.value or b"") + len(r.key or b"") for r in records)
        with self.lock:
            self.built.append(split)
        return BuiltSegment(
            split_id=split.id,
            location=f"mem://{split.id}",
            files=(f"mem://{split.id}/f",) if rows else (),
            row_count=rows,
            size_bytes=rows,
            record_bytes=record_bytes,
        )

    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuiltSegment | Exception]:
        with self.lock:
            self.batches.append([split.start for split in splits])
        live = [split for split in splits if not split.kill_switch.tripped]
        with self.lock:
            poisoned = [s.start for s in live if self.batch_failures.get(s.start, 0) > 0]
            for start in poisoned:
                self.batch_failures[start] -= 1
        if poisoned:
            return [BuildError(f"the batch's job failed on the split at {poisoned[0]}") for _ in splits]
        waiting = {s.id for s in live if self.registry_down and (s.tp, s.start) in self.needs_registry}
        registered = self._register([split for split in live if split.id not in waiting], spec)
        results: list[BuiltSegment | Exception] = []
        for split in splits:
            if split.kill_switch.tripped:
                results.append(SplitKilled(split.kill_switch.reason or "killed"))
            elif split.id in waiting:
                with self.lock:
                    self.refused.append((split.start, self.clock.monotonic()))
                results.append(RegistryUnavailable("schema registry http://127.0.0.1:1 did not answer"))
            elif registered is not None:
                results.append(registered)
            else:
                try:
                    results.append(self._build_one(split))
                except (BuildError, SplitKilled) as exc:
                    results.append(exc)
        return results

    def _register(self, live: Sequence[SealedSplit], spec: SourceSpec) -> Exception | None:
        """Register the batch's live splits; the error every split of it fails with, if that failed."""
        if not live or self.registrar is None:
            return None
        build = uuid.uuid4()
        root = f"mem://{spec.name}/{{}}/{build}"
        try:
            self.registrar.register(
                BuildRegistration(
                    build,
                    spec.name,
                    root.format("_staging"),
                    root.format("segments"),
                    root.format("rejects"),
                    tuple(split.id for split in live),
                ),
                live,
            )
        except SplitKilled as exc:
            return exc
        except Exception as exc:
            return BuildError(f"registration failed: {exc}")
        return None

    def discard(self, segment: BuiltSegment) -> None:
        """What the publish stage is given to delete a built split's files with."""
        with self.lock:
            self.discarded.append(segment.split_id)


class RecordingRegistrar:
    """Records each build's registration and checks it comes before the build writes:
    none of the registered local directories exists yet when it is registered."""

    def __init__(self) -> None:
        self.builds: list[BuildRegistration] = []
        self.written_before_registration: list[str] = []

    def register(self, build: BuildRegistration, splits: Sequence[SealedSplit]) -> None:
        assert {s.id for s in splits} == set(build.split_ids)
        for location in (build.staging, build.data, build.rejects):
            if location.startswith("file://") and Path(location.removeprefix("file://")).exists():
                self.written_before_registration.append(location)
        self.builds.append(build)

    def registered(self, uri: str) -> bool:
        return any(uri.startswith(loc + "/") for b in self.builds for loc in (b.staging, b.data, b.rejects))
