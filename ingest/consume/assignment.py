"""The partitions this worker owns right now: each one's claim, cutter and lifecycle.

A partition's lifecycle is one state machine. Its methods are the only writers of its state,
and each refuses a transition the protocol does not have (IllegalTransition: a bug)::

    ACTIVE ──refused──▶ OUT_OF_RANGE ──(gap measured)──▶ REWINDING / FENCED / ACTIVE
      │  ▲                                                 │
      │  └──────────────── repositioned ◀──────────────────┘
      ├──rewind──▶ REWINDING ──(stored offset read)──▶ ACTIVE (repositioned) / FENCED
      └──fence──▶ FENCED (until revoked, lost or re-claimed by a reset)

Every way back to ACTIVE is :meth:`OwnedPartition.repositioned` (the loop's one
repositioning path, ingest.consume.positioning); a new claim (``ingest reset``) may leave any state.
Only the polling thread touches this table (rebalance callbacks run on it too).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ingest.consume.cutter import OffsetSize, PartitionCutter
from ingest.consume.kafka import Truncation
from ingest_common.backoff import Backoff
from ingest_common.errors import IngestError
from ingest_common.model import PartitionClaim, TopicPartition

# Before the n-th consecutive rewind of a partition re-reads its stored offset.
REWIND_BACKOFF = Backoff.stepped(0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class IllegalTransition(IngestError):
    """A partition was asked to change state in a way its lifecycle does not allow (a bug)."""


class PartitionState(enum.Enum):
    ACTIVE = "active"
    # A split failed or was refused for an offset mismatch: waiting to re-seek to the stored offset.
    REWINDING = "rewinding"
    # Refused for a serial mismatch: another worker owns it now; paused until revoked or lost.
    FENCED = "fenced"
    # The stored offset is no longer in the log (retention, topic re-created): stopped, never
    # silently skipped, until the gap is measured against the stored offset and acted on.
    OUT_OF_RANGE = "out_of_range"


@dataclass(slots=True)
class OwnedPartition:
    claim: PartitionClaim
    cutter: PartitionCutter
    # Bytes per offset of the partition's records, learned from its built splits (kept across
    # cutters: the data does not change with a rewind).
    size: OffsetSize = field(default_factory=OffsetSize)
    state: PartitionState = PartitionState.ACTIVE
    # Where the stored offset stands as far as this worker knows: the end of the last split it
    # published, or the stored offset it was last repositioned to (None: the claim's).
    published_end: int | None = None
    # REWINDING / OUT_OF_RANGE: when to try again, and failures in a row (the rewind's backoff).
    retry_at: float = 0.0
    failures: int = 0
    # OUT_OF_RANGE: the offset Kafka refused, and whether the gap is still to be measured.
    refused_offset: int | None = None
    # OUT_OF_RANGE after a KIP-320 validation failed: the truncation librdkafka reported.
    truncation: Truncation | None = None
    gap_pending: bool = False
    # A metastore read or write for this partition runs in the background (ingest.consume.background):
    # nothing else is started for it until its result is applied.
    busy: bool = False
    # Kafka's id of the topic the stored offset is in, as the metastore holds it for this claim
    # (the claim's, then each stored position read; None: none held yet). A log-end answer
    # naming another stops the partition (ingest.consume.log_ends).
    topic_id: str | None = None

    @property
    def tp(self) -> TopicPartition:
        return self.claim.tp

    @property
    def epoch(self) -> int:
        return self.cutter.epoch

    @property
    def active(self) -> bool:
        return self.state is PartitionState.ACTIVE

    def _new_cutter(self, position: int | None, leader_epoch: int | None = None) -> None:
        """Cut from ``position`` (known under ``leader_epoch``: validated first) on, in a new
        generation (splits of older generations are never acted on again)."""
        self.cutter = PartitionCutter(
            self.tp, self.claim.serial, position, epoch=self.cutter.epoch + 1, position_epoch=leader_epoch
        )

    def _require(self, *states: PartitionState) -> None:
        if self.state not in states:
            raise IllegalTransition(f"{self.tp}: {self.state.value} -> not allowed from here (needs {states})")

    # -- transitions ---------------------------------------------------------------

    def rewind(self, now: float) -> float:
        """Stop cutting; re-read the stored offset after a backoff. Returns the backoff."""
        self._require(PartitionState.ACTIVE, PartitionState.OUT_OF_RANGE, PartitionState.REWINDING)
        backoff = REWIND_BACKOFF.delay(self.failures)
        self.failures += 1
        self.state = PartitionState.REWINDING
        self.retry_at = now + backoff
        self.gap_pending = False
        self._new_cutter(None)
        return backoff

    def fence(self) -> None:
        """Another worker owns the partition: cut nothing more until it is revoked."""
        self.state = PartitionState.FENCED
        self.gap_pending = False
        self._new_cutter(None)

    def refuse(self, offset: int | None, truncation: Truncation | None = None) -> None:
        """The offsets from ``offset`` on are no longer in the log (or the log was found
        truncated below a validated position): stop until the gap is measured (at once)."""
        self._require(PartitionState.ACTIVE)
        self.state = PartitionState.OUT_OF_RANGE
        self.refused_offset = offset
        self.truncation = truncation
        self.gap_pending = True
        self.retry_at = 0.0
        self._new_cutter(None)

    def gap_settled(self) -> None:
        """The gap was recorded and the partition stays stopped (policy ``fail``, or past the log end)."""
        self._require(PartitionState.OUT_OF_RANGE)
        self.gap_pending = False

    def repositioned(self, offset: int | None, leader_epoch: int | None = None) -> None:
        """Splits are cut from ``offset`` again (validated first under ``leader_epoch``, if known)."""
        self._require(PartitionState.ACTIVE, PartitionState.REWINDING, PartitionState.OUT_OF_RANGE)
        self.state = PartitionState.ACTIVE
        self.gap_pending = False
        if offset is not None:
            self.published_end = offset
        self._new_cutter(offset, leader_epoch)

    def reclaimed(self, claim: PartitionClaim) -> None:
        """``ingest reset`` moved the serial: a new claim, whatever the state (the caller repositions)."""
        self.claim = claim
        self.topic_id = claim.topic_id
        self.failures = 0
        self.published_end = None
        self.state = PartitionState.ACTIVE
        self.gap_pending = False
        self._new_cutter(claim.next_offset, claim.leader_epoch)

    def published(self, end: int) -> None:
        self.published_end = end
        self.failures = 0

    # -- a metastore call for the partition, in the background ------------------------

    def rewind_due(self, now: float) -> bool:
        """Rewinding, its backoff over, and no read of the stored offset under way."""
        return self.state is PartitionState.REWINDING and not self.busy and self.retry_at <= now

    def gap_due(self, now: float) -> bool:
        """Stopped at a refused offset whose gap is still to be measured, and due to try."""
        return self.state is PartitionState.OUT_OF_RANGE and self.gap_pending and not self.busy and self.retry_at <= now

    def call_started(self, retry_at: float | None = None) -> None:
        """A metastore call for the partition runs in the background: nothing else is started
        for it until :meth:`call_ended`. ``retry_at``: when to try again if its result does
        not settle the state."""
        self._require(PartitionState.REWINDING, PartitionState.OUT_OF_RANGE)
        if self.busy:
            raise IllegalTransition(f"{self.tp}: a metastore call for it is already under way")
        self.busy = True
        if retry_at is not None:
            self.retry_at = retry_at

    def call_ended(self, retry_at: float | None = None) -> None:
        """The call's result (or failure) is being applied; ``retry_at``: not before then again."""
        self.busy = False
        if retry_at is not None:
            self.retry_at = retry_at


class Assignment:
    def __init__(self) -> None:
        self._owned: dict[tuple[str, int], OwnedPartition] = {}

    def add(self, claim: PartitionClaim) -> OwnedPartition:
        cutter = PartitionCutter(claim.tp, claim.serial, claim.next_offset, position_epoch=claim.leader_epoch)
        owned = OwnedPartition(claim, cutter, topic_id=claim.topic_id)
        self._owned[(claim.tp.topic, claim.tp.partition)] = owned
        return owned

    def remove(self, tps: Iterable[TopicPartition]) -> list[OwnedPartition]:
        removed = []
        for tp in tps:
            owned = self._owned.pop((tp.topic, tp.partition), None)
            if owned is not None:
                removed.append(owned)
        return removed

    def get(self, tp: TopicPartition) -> OwnedPartition | None:
        return self._owned.get((tp.topic, tp.partition))

    def lookup(self, topic: str, partition: int) -> OwnedPartition | None:
        return self._owned.get((topic, partition))

    def __iter__(self) -> Iterator[OwnedPartition]:
        return iter(list(self._owned.values()))

    def __len__(self) -> int:
        return len(self._owned)

    def tps(self) -> list[TopicPartition]:
        return [owned.tp for owned in self._owned.values()]
