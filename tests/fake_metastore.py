"""The metastore in memory, for unit tests: FakeStore's publish with the real one's checks (serial,
start offset, registered builds, idempotent by split id) and failures to inject, and
MemoryMetastore, the calls of a worker's loop, rebalance handler and registry over it (tests/contract
runs the same tests against it and PostgreSQL)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ingest_common.model import (
    BuildRegistration,
    DesiredState,
    PartitionClaim,
    SegmentToPublish,
    SourceControl,
    StartFrom,
    StoredPosition,
    TopicPartition,
)
from ingest_common.redact import redact
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable, PublishConflict, Session, SourceNotFound
from tests.fake_compaction import CompactionFake


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass
class FakeStore:
    """An in-memory metastore with the same publish checks as the real one, idempotent by
    split id like it (migration 0011): a split already published answers with its id; one
    with files that no build registered is refused (migration 0008)."""

    serials: dict[TopicPartition, int] = field(default_factory=dict)
    next_offsets: dict[TopicPartition, int | None] = field(default_factory=dict)
    # The leader epoch stored with each next offset (migration 0020); absent: NULL.
    leader_epochs: dict[TopicPartition, int | None] = field(default_factory=dict)
    segments: dict[uuid.UUID, SegmentToPublish] = field(default_factory=dict)
    unavailable_for: int = 0
    lose_commit_ack: int = 0
    # Publishes whose reply is lost while they wait on the server: they raise
    # CommitOutcomeUnknown having written nothing, and their sessions go on (``orphans``)
    # until ``commit_orphans``.
    lose_reply: int = 0
    orphans: list[SegmentToPublish] = field(default_factory=list)
    # Raised by the next publish (an error the publisher does not know), then cleared.
    publish_error: Exception | None = None
    # Called with the split id after each ``segment_for_split`` answered.
    on_lookup: Callable[[uuid.UUID], None] | None = None
    # While clear, a publish waits before it takes the store (its transaction holds the
    # partition's rows; reads go on): a publish that hangs on the server.
    publish_open: threading.Event = field(default_factory=lambda: _set_event())
    # Splits a build registered, each 'building' until published (migration 0008).
    splits: dict[uuid.UUID, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def register_build(self, worker: str, build: BuildRegistration) -> None:
        with self.lock:
            for split_id in build.split_ids:
                self.splits.setdefault(split_id, "building")

    def publish(self, item: SegmentToPublish) -> int:
        self.publish_open.wait(60)
        with self.lock:
            if self.unavailable_for > 0:
                self.unavailable_for -= 1
                raise MetastoreUnavailable("injected outage")
            if self.publish_error is not None:
                error, self.publish_error = self.publish_error, None
                raise error
            if self.lose_reply > 0:
                self.lose_reply -= 1
                self.orphans.append(item)
                raise CommitOutcomeUnknown("injected: connection lost while the publish waited on the server")
            if item.segment.split_id in self.segments:
                return self._segment_id(item.segment.split_id)
            for r in item.ranges:
                tp = r.range.tp
                if tp not in self.serials:
                    raise PublishConflict("missing", tp, r.serial, None)
                if self.serials[tp] != r.serial:
                    raise PublishConflict("serial", tp, r.serial, self.serials.get(tp))
                stored = self.next_offsets.get(tp)
                if stored != r.range.start:  # NULL (never pinned) refuses too (migration 0010)
                    raise PublishConflict("offset", tp, r.range.start, stored)
            segment = item.segment
            if self.splits.get(segment.split_id) == "building":
                self.splits[segment.split_id] = "published"
            elif segment.split_id in self.splits or segment.files or segment.rejects_files:
                # A split without files (offsets that hold no record) needs no build.
                reason = "abandoned" if segment.split_id in self.splits else "unregistered"
                raise PublishConflict(reason, item.ranges[0].range.tp, None, None)
            for r in item.ranges:
                self.next_offsets[r.range.tp] = r.range.end
                self.leader_epochs[r.range.tp] = r.leader_epoch
            self.segments[item.segment.split_id] = item
            if self.lose_commit_ack > 0:
                self.lose_commit_ack -= 1
                raise CommitOutcomeUnknown("injected: connection lost during COMMIT (it did commit)")
            return len(self.segments)

    def _segment_id(self, split_id: uuid.UUID) -> int:
        return list(self.segments).index(split_id) + 1

    def end_session(self, session: Session) -> bool:
        return True  # an injected unknown outcome has no session left running

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        with self.lock:
            found = self._segment_id(split_id) if split_id in self.segments else None
        if self.on_lookup is not None:
            self.on_lookup(split_id)
        return found

    def commit_orphans(self) -> None:
        """The sessions orphaned by lost replies go on: each commits now, or is refused (and
        writes nothing), as its publish would have."""
        orphans, self.orphans = self.orphans, []
        for item in orphans:
            with contextlib.suppress(PublishConflict):
                self.publish(item)


class MemoryMetastore(CompactionFake, FakeStore):
    """The metastore calls of a worker's loop, rebalance handler and registry, in memory, for
    one source. tests/contract runs the same tests against it and the real Metastore."""

    def __init__(self, source: str = "src", spec: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.source = source
        self.spec: dict[str, Any] = spec if spec is not None else {"name": source}
        self.spec_version = 1
        self.owners: dict[TopicPartition, str | None] = {}
        self.initial: dict[TopicPartition, StartFrom] = {}
        self.control_state = SourceControl(DesiredState.RUNNING, False, 0, 1)
        # Every beat (worker, state, partitions), and each worker's row as the last beat left
        # it (ingest_workers: one row per worker id, any source, as migration 0003 has it).
        self.heartbeats: list[tuple[str, str, tuple[str, ...]]] = []
        self.reported_spec_versions: list[int | None] = []
        self.workers: dict[str, dict[str, Any]] = {}
        # Every error report as ingest_errors holds it (source, worker, kind, message, at).
        self.error_rows: list[dict[str, Any]] = []
        self.gaps: list[tuple[TopicPartition, int, int, bool]] = []
        self.truncations: list[tuple[TopicPartition, int, int]] = []
        # Kafka's topic id stored with each partition's offset (migration 0027; absent: NULL), and
        # the re-created topics recorded: (partition, from, to, old id, new id).
        self.topic_ids: dict[TopicPartition, str | None] = {}
        self.recreations: list[tuple[TopicPartition, int, int, str, str]] = []
        # Set to make every call wait until it is cleared (a metastore that hangs).
        self.hang = threading.Event()
        self.released = threading.Event()
        self.released.set()

    def _call(self, source: str | None) -> None:
        """Every call: hangs and outages as injected; a source other than this one's is
        unknown (None: a call that writes for any source, as heartbeats and errors do)."""
        if self.hang.is_set():
            self.released.wait(60)
        if self.unavailable_for > 0:
            self.unavailable_for -= 1
            raise MetastoreUnavailable("injected outage")
        if source is not None and source != self.source:
            raise SourceNotFound(source)

    @property
    def errors(self) -> list[tuple[str, str]]:
        """This source's error reports as (kind, message), oldest first."""
        return [(r["kind"], r["message"]) for r in self.error_rows if r["source"] == self.source]

    def register_build(self, worker: str, build: BuildRegistration) -> None:
        with self.lock:
            self._call(build.source)
        super().register_build(worker, build)

    def register_partitions(self, source: str, topic: str, partitions: Iterable[int], initial: StartFrom) -> None:
        with self.lock:
            self._call(source)
            for p in partitions:
                tp = TopicPartition(topic, p)
                if tp not in self.serials:
                    self.serials[tp] = 0
                    self.next_offsets[tp] = None
                    self.initial[tp] = initial

    def claim_partitions(
        self,
        source: str,
        worker: str,
        tps: Sequence[TopicPartition],
        topic_ids: Mapping[str, str | None] | None = None,
    ) -> dict[TopicPartition, PartitionClaim]:
        with self.lock:
            self._call(source)
            claims = {}
            for tp in sorted(set(tps)):
                if tp not in self.serials:  # a partition that appeared later starts from earliest
                    self.serials[tp], self.next_offsets[tp], self.initial[tp] = 0, None, "earliest"
                self.serials[tp] += 1
                self.owners[tp] = worker
                found = (topic_ids or {}).get(tp.topic)
                if found is not None and (self.topic_ids.get(tp) is None or self.next_offsets[tp] is None):
                    self.topic_ids[tp] = found
                claims[tp] = PartitionClaim(
                    tp,
                    self.serials[tp],
                    self.next_offsets[tp],
                    self.initial[tp],
                    self.leader_epochs.get(tp),
                    topic_id=self.topic_ids.get(tp),
                )
            return claims

    def pin_start_offsets(
        self, source: str, pins: Sequence[tuple[PartitionClaim, int]]
    ) -> dict[TopicPartition, PartitionClaim]:
        with self.lock:
            self._call(source)
            pinned = {}
            for claim, offset in pins:
                tp = claim.tp
                if self.serials.get(tp) != claim.serial:
                    continue
                if self.next_offsets[tp] is None:
                    self.next_offsets[tp] = offset
                pinned[tp] = PartitionClaim(
                    tp, claim.serial, self.next_offsets[tp], self.initial[tp], topic_id=self.topic_ids.get(tp)
                )
            return pinned

    def release_partition(self, source: str, worker: str, claim: PartitionClaim) -> None:
        with self.lock:
            self._call(source)
            if self.owners.get(claim.tp) == worker and self.serials.get(claim.tp) == claim.serial:
                self.owners[claim.tp] = None

    def partition_state(self, source: str, tp: TopicPartition) -> tuple[int, int | None] | None:
        with self.lock:
            self._call(source)
            return (self.serials[tp], self.next_offsets[tp]) if tp in self.serials else None

    def stored_position(self, source: str, tp: TopicPartition) -> StoredPosition | None:
        with self.lock:
            self._call(source)
            if tp not in self.serials:
                return None
            return StoredPosition(
                self.serials[tp], self.next_offsets[tp], self.leader_epochs.get(tp), self.topic_ids.get(tp)
            )

    def record_topic_id(self, source: str, tp: TopicPartition, serial: int, topic_id: str) -> str | None:
        with self.lock:
            self._call(source)
            if self.serials.get(tp) != serial:
                return None
            if self.topic_ids.get(tp) is None or not self.next_offsets.get(tp):
                self.topic_ids[tp] = topic_id
            return self.topic_ids[tp]

    def record_topic_recreation(
        self,
        source: str,
        worker: str,
        tp: TopicPartition,
        from_offset: int,
        to_offset: int,
        old_topic_id: str,
        new_topic_id: str,
    ) -> None:
        with self.lock:
            self._call(source)
            self.recreations.append((tp, from_offset, to_offset, old_topic_id, new_topic_id))

    def reset(self, tp: TopicPartition, offset: int, topic_id: str | None = None) -> None:
        """What ``ingest reset`` does to one partition: new offset, serial bumped, generation
        moved, the topic id Kafka gave it (None: not known) stored."""
        with self.lock:
            self.next_offsets[tp] = offset
            self.topic_ids[tp] = topic_id
            self.leader_epochs[tp] = None
            self.serials[tp] += 1
            c = self.control_state
            self.control_state = SourceControl(c.desired_state, c.drain_stay, c.reset_generation + 1, c.spec_version)

    def reclaim_partitions(
        self, source: str, worker: str, held: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, PartitionClaim]:
        with self.lock:
            self._call(source)
            claims = {}
            for tp, serial in sorted(held, key=lambda h: h[0]):
                if self.serials.get(tp, serial) != serial and self.owners.get(tp) == worker:
                    self.serials[tp] += 1
                    claims[tp] = PartitionClaim(
                        tp, self.serials[tp], self.next_offsets[tp], self.initial[tp], topic_id=self.topic_ids.get(tp)
                    )
            return claims

    def record_gap(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None:
        with self.lock:
            self._call(source)
            self.gaps.append((tp, from_offset, to_offset, False))

    def record_truncation(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None:
        with self.lock:
            self._call(source)
            self.truncations.append((tp, from_offset, to_offset))

    def skip_gap(
        self, source: str, worker: str, tp: TopicPartition, serial: int, from_offset: int, to_offset: int
    ) -> int:
        with self.lock:
            self._call(source)
            if tp not in self.serials:
                raise PublishConflict("missing", tp, serial, None)
            if self.serials[tp] != serial:
                raise PublishConflict("serial", tp, serial, self.serials[tp])
            stored = self.next_offsets[tp]
            if stored is not None and stored != from_offset:
                raise PublishConflict("offset", tp, from_offset, stored)
            self.next_offsets[tp] = to_offset
            self.leader_epochs[tp] = None
            self.gaps.append((tp, from_offset, to_offset, True))
            return len(self.gaps)

    def heartbeat(
        self,
        source: str,
        worker: str,
        host: str,
        pid: int,
        version: str,
        state: str,
        partitions: Sequence[str],
        spec_version: int | None = None,
        *,
        started_at: datetime | None = None,
        registry_waiting: Sequence[str] = (),
        registry_error: str | None = None,
    ) -> None:
        with self.lock:
            self._call(None)
            self.heartbeats.append((worker, state, tuple(partitions)))
            self.reported_spec_versions.append(spec_version)
            previous = self.workers.get(worker)
            now = datetime.now(UTC)
            # A worker id reused by a new process: its row is replaced, its start kept unless given.
            kept = previous["started_at"] if previous is not None else now
            self.workers[worker] = {
                "worker": worker,
                "source": source,
                "host": host,
                "pid": pid,
                "version": version,
                "state": state,
                "partitions": list(partitions),
                "spec_version": spec_version,
                "started_at": started_at if started_at is not None else kept,
                "heartbeat_at": now,
                "registry_waiting": list(registry_waiting),
                "registry_error": registry_error,
            }

    def live_workers(self, source: str, expiry_s: float = 30.0) -> list[dict[str, Any]]:
        """As the metastore's status query: workers of ``source`` that beat within ``expiry_s``
        and neither stopped nor failed, by worker id."""
        with self.lock:
            self._call(None)
            since = datetime.now(UTC) - timedelta(seconds=expiry_s)
            return [
                {k: v for k, v in row.items() if k != "source"}
                for _, row in sorted(self.workers.items())
                if row["source"] == source and row["heartbeat_at"] > since and row["state"] not in ("stopped", "failed")
            ]

    def record_error(self, source: str, worker: str, kind: str, message: str) -> None:
        with self.lock:
            self._call(None)
            row = {"source": source, "worker": worker, "kind": kind, "message": redact(message)[:2000]}
            self.error_rows.append(row | {"at": datetime.now(UTC)})

    def recent_errors(self, source: str, limit: int = 10) -> list[dict[str, Any]]:
        """As the metastore's status query: ``source``'s last ``limit`` error reports, newest first."""
        with self.lock:
            self._call(None)
            rows = [{k: v for k, v in r.items() if k != "source"} for r in self.error_rows if r["source"] == source]
            return rows[::-1][:limit]

    def control(self, source: str) -> SourceControl:
        with self.lock:
            self._call(source)
            return self.control_state

    def set_control(self, source: str, state: DesiredState, stay: bool = False) -> None:
        with self.lock:
            self._call(source)
            c = self.control_state
            self.control_state = SourceControl(state, stay, c.reset_generation, c.spec_version)

    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self._call(name)
            return self.spec_version, self.spec
