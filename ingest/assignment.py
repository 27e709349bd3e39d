"""The partitions this worker owns right now, with their claim and open buffer.

Only the polling thread touches this table (rebalance callbacks run on it too).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ingest.split import PartitionBuffer
from ingest_common.model import PartitionClaim, TopicPartition


class PartitionStatus(enum.Enum):
    ACTIVE = "active"
    # A split failed or was refused for an offset mismatch: waiting to re-seek to the stored offset.
    REWINDING = "rewinding"
    # Refused for a serial mismatch: another worker owns it now; paused until revoked or lost.
    FENCED = "fenced"
    # The stored offset is no longer in the log (retention, topic re-created): stopped,
    # never silently skipped. With on_offset_out_of_range = "earliest" the loop moves it past
    # the gap (recorded in the gap ledger) and it becomes ACTIVE again; otherwise it stays.
    OUT_OF_RANGE = "out_of_range"


@dataclass(slots=True)
class OwnedPartition:
    claim: PartitionClaim
    buffer: PartitionBuffer
    status: PartitionStatus = PartitionStatus.ACTIVE
    # End of the last split published in this assignment (None: nothing published yet).
    published_end: int | None = None
    # While REWINDING: when to try the re-seek, and how many failures led here (backoff).
    retry_at: float = 0.0
    failures: int = 0
    # While OUT_OF_RANGE: the offset Kafka refused, and whether the gap is still to be
    # measured and recorded (retried while Kafka or the metastore does not answer).
    refused_offset: int | None = None
    gap_pending: bool = False
    # Whether the consumer has this partition paused. A new assignment starts unpaused, as
    # the consumer does, so the flag lives and dies with the assignment.
    paused: bool = False

    @property
    def tp(self) -> TopicPartition:
        return self.claim.tp

    @property
    def epoch(self) -> int:
        return self.buffer.epoch

    def reset_buffer(self, position: int | None) -> None:
        """Drop buffered records and start a new epoch at ``position``."""
        self.buffer = PartitionBuffer(self.tp, self.claim.serial, position, epoch=self.buffer.epoch + 1)


class Assignment:
    def __init__(self) -> None:
        self._owned: dict[tuple[str, int], OwnedPartition] = {}

    def add(self, claim: PartitionClaim) -> OwnedPartition:
        owned = OwnedPartition(claim, PartitionBuffer(claim.tp, claim.serial, claim.next_offset))
        self._owned[(claim.tp.topic, claim.tp.partition)] = owned
        return owned

    def remove(self, tps: Iterable[TopicPartition]) -> list[OwnedPartition]:
        removed = []
        for tp in tps:
            owned = self._owned.pop((tp.topic, tp.partition), None)
            if owned is not None:
                removed.append(owned)
        return removed

    def get(self, topic: str, partition: int) -> OwnedPartition | None:
        return self._owned.get((topic, partition))

    def __iter__(self) -> Iterator[OwnedPartition]:
        return iter(list(self._owned.values()))

    def __len__(self) -> int:
        return len(self._owned)

    def tps(self) -> list[TopicPartition]:
        return [owned.tp for owned in self._owned.values()]

    def buffered_bytes(self) -> int:
        return sum(owned.buffer.size_bytes for owned in self._owned.values())
