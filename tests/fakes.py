"""Fakes of the project's own interfaces, for unit tests."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ingest.errors import BuildError, SplitKilled
from ingest.spec import SourceSpec
from ingest.split import KillSwitch, SealedSplit
from ingest_common.model import BuildRegistration, BuiltSegment, SegmentToPublish, TopicPartition
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable, PublishConflict


@dataclass(frozen=True, slots=True)
class FakeRecord:
    _offset: int
    _value: bytes | None = b"{}"
    _key: bytes | None = None
    _ts: int = 1_700_000_000_000

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def make_split(tp: TopicPartition, start: int, end: int, serial: int = 1, epoch: int = 0) -> SealedSplit:
    records = tuple(FakeRecord(o) for o in range(start, end))
    return SealedSplit(
        id=uuid.uuid4(),
        tp=tp,
        serial=serial,
        start=start,
        end=end,
        records=records,
        size_bytes=10 * len(records),
        first_record_at=0.0,
        sealed_at=0.0,
        seal_reason="test",
        kill_switch=KillSwitch(),
        epoch=epoch,
    )


class FakeBuilder:
    """Builds instantly unless a gate is set for a split's start offset; can fail N times."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.failures: dict[int, int] = {}
        self.built: list[SealedSplit] = []
        self.discarded: list[uuid.UUID] = []
        self.batches: list[list[int]] = []
        self.lock = threading.Lock()

    def build(self, split: SealedSplit, spec: SourceSpec) -> BuiltSegment:
        gate = self.gates.get(split.start)
        if gate is not None:
            while not gate.wait(0.01):
                split.kill_switch.check()
        split.kill_switch.check()
        with self.lock:
            if self.failures.get(split.start, 0) > 0:
                self.failures[split.start] -= 1
                raise BuildError("injected build failure")
            self.built.append(split)
        return BuiltSegment(
            split_id=split.id,
            location=f"mem://{split.id}",
            files=(f"mem://{split.id}/f",),
            row_count=len(split),
            size_bytes=len(split),
        )

    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuiltSegment | Exception]:
        with self.lock:
            self.batches.append([split.start for split in splits])
        results: list[BuiltSegment | Exception] = []
        for split in splits:
            try:
                results.append(self.build(split, spec))
            except (BuildError, SplitKilled) as exc:
                results.append(exc)
        return results

    def discard(self, segment: BuiltSegment) -> None:
        with self.lock:
            self.discarded.append(segment.split_id)


@dataclass
class FakeStore:
    """An in-memory metastore with the same publish checks as the real one."""

    serials: dict[TopicPartition, int] = field(default_factory=dict)
    next_offsets: dict[TopicPartition, int | None] = field(default_factory=dict)
    segments: dict[uuid.UUID, SegmentToPublish] = field(default_factory=dict)
    unavailable_for: int = 0
    lose_commit_ack: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, item: SegmentToPublish) -> int:
        with self.lock:
            if self.unavailable_for > 0:
                self.unavailable_for -= 1
                raise MetastoreUnavailable("injected outage")
            for r in item.ranges:
                tp = r.range.tp
                if self.serials.get(tp) != r.serial:
                    raise PublishConflict("serial", tp, r.serial, self.serials.get(tp))
                stored = self.next_offsets.get(tp)
                if stored is not None and stored != r.range.start:
                    raise PublishConflict("offset", tp, r.range.start, stored)
            for r in item.ranges:
                self.next_offsets[r.range.tp] = r.range.end
            self.segments[item.segment.split_id] = item
            if self.lose_commit_ack > 0:
                self.lose_commit_ack -= 1
                raise CommitOutcomeUnknown("injected: connection lost during COMMIT (it did commit)")
            return len(self.segments)

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        with self.lock:
            return 1 if split_id in self.segments else None


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
