"""What the consume loop's parts share: one :class:`LoopContext` (the source and worker, the
spec holder, the consumer, the partitions owned, the splits in flight, the metastore
connections, the background thread, the metrics and the clock), built once by the worker and
handed to each of them (positioning, gaps, controls, outcomes, rebalance, heartbeats, gauges).

The metastore calls they make are named here, one narrow Protocol per part; the loop's
background connection is all of them (``LoopStore``), the rebalance callbacks' connection
the claims (``ClaimStore``). What they need of the splits in flight is as narrow: kill the splits of
some partitions (``Killer``), read what is in flight (``InFlight``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from ingest.consume.assignment import Assignment
from ingest.consume.background import Background
from ingest.consume.kafka import Consumer
from ingest.consume.validator import PositionValidator
from ingest.ops.metrics import Metrics
from ingest.spec.holder import SpecHolder
from ingest_common.backoff import SYSTEM_CLOCK, Clock
from ingest_common.model import KillReason, PartitionClaim, SourceControl, StoredPosition, TopicPartition
from metastore.errors import MetastoreError

log = structlog.get_logger(__name__)

# -- the metastore calls of each part ------------------------------------------------------


class StateStore(Protocol):
    """Positioning: a rewind reads the stored serial, offset and leader epoch."""

    def partition_state(self, source: str, tp: TopicPartition) -> tuple[int, int | None] | None: ...
    def stored_position(self, source: str, tp: TopicPartition) -> StoredPosition | None: ...


class GapStore(StateStore, Protocol):
    """Gaps: measured against the stored offset, recorded, or skipped (serial-guarded)."""

    def record_gap(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None: ...
    def record_truncation(
        self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int
    ) -> None: ...
    def skip_gap(
        self, source: str, worker: str, tp: TopicPartition, serial: int, from_offset: int, to_offset: int
    ) -> int: ...
    def record_topic_id(self, source: str, tp: TopicPartition, serial: int, topic_id: str) -> str | None: ...
    def record_topic_recreation(
        self,
        source: str,
        worker: str,
        tp: TopicPartition,
        from_offset: int,
        to_offset: int,
        old_topic_id: str,
        new_topic_id: str,
    ) -> None: ...


class ControlStore(Protocol):
    """Controls: a reset's re-claim, a new spec version."""

    def reclaim_partitions(
        self, source: str, worker: str, held: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, PartitionClaim]: ...
    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]: ...


class RegistryStore(Protocol):
    """Heartbeats: the worker's registry entry, the controls read with it, error reports."""

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
    ) -> None: ...
    def record_error(self, source: str, worker: str, kind: str, message: str) -> None: ...
    def control(self, source: str) -> SourceControl: ...


class LoopStore(GapStore, ControlStore, RegistryStore, Protocol):
    """The background thread's connection (ingest.consume.background): every call above."""


class ClaimStore(Protocol):
    """The rebalance callbacks' connection, on the polling thread: claims and releases."""

    def claim_partitions(
        self,
        source: str,
        worker: str,
        tps: Sequence[TopicPartition],
        topic_ids: Mapping[str, str | None] | None = None,
    ) -> dict[TopicPartition, PartitionClaim]: ...
    def pin_start_offsets(
        self, source: str, pins: Sequence[tuple[PartitionClaim, int]]
    ) -> dict[TopicPartition, PartitionClaim]: ...
    def release_partition(self, source: str, worker: str, claim: PartitionClaim) -> None: ...


# -- what the parts need of the splits in flight -----------------------------------------------------


class Killer(Protocol):
    def kill(self, tps: Iterable[TopicPartition], reason: KillReason, within_s: float | None = None) -> int:
        """Trip the kill switch of every in-flight split of ``tps`` (waiting up to ``within_s``
        for commits in progress); how many were tripped."""
        ...


class InFlight(Protocol):
    @property
    def inflight_count(self) -> int: ...
    @property
    def inflight_bytes(self) -> int: ...
    def oldest_available_at(self, tp: TopicPartition) -> float | None: ...


@dataclass(frozen=True, slots=True)
class LoopContext:
    worker_id: str
    specs: SpecHolder
    consumer: Consumer
    # Confirms a position under its leader epoch before splits are cut from it (KIP-320).
    validator: PositionValidator
    assignment: Assignment
    # The splits in flight (ingest.publish.queue), as far as repositioning, gaps, controls and
    # rebalances need them.
    killer: Killer
    store: LoopStore
    claims: ClaimStore
    background: Background
    metrics: Metrics
    # Everything the loop's parts schedule (rewinds, retries, deadlines, heartbeats) reads it.
    clock: Clock = SYSTEM_CLOCK

    @property
    def source(self) -> str:
        # A spec version never renames its source (ingest.consume.controls loads it by name).
        return self.specs.spec.name

    def on_failure(
        self, event: str, *, release: Callable[[], None] | None = None, **fields: Any
    ) -> Callable[[Exception], None]:
        """The ``failed`` callback of a background metastore call (every part's is this one):
        ``release`` what the call held (a busy flag; when to try again), then raise anything but
        a metastore error on the polling thread (a bug: the worker stops); a metastore error is
        counted in ``ingest_metastore_errors`` (every one: a heartbeat's too) and logged as ``event``,
        and the caller tries again on its own schedule."""

        def failed(exc: Exception) -> None:
            if release is not None:
                release()
            if not isinstance(exc, MetastoreError):
                raise exc
            self.metrics.metastore_errors.labels(self.source).inc()
            log.warning(event, source=self.source, worker=self.worker_id, error=str(exc), **fields)

        return failed
