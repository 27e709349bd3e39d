"""A sealed split: a range of one partition's offsets, cut by the worker that owns the
partition and handed to the build stage, then to the publish stage. It holds no records:
Spark reads them from Kafka (ingest.builder.kafka_read).

Invariants:
- A split belongs to one partition, one claim (``serial``) and one cut generation
  (``epoch``, bumped by every rewind, reset or re-claim of the partition): outcomes of an
  older generation are never acted on.
- ``[start, end)`` is cut from offsets: ``start`` is where the previous split of the
  generation ended (or the stored offset it was repositioned to), ``end`` at most the
  partition's last stable offset when the split was cut. Consecutive splits of a generation
  tile the partition's offsets with no gap and no overlap; offsets that carry no record for a
  ``read_committed`` reader (transaction markers, aborted records, compacted-away records) are
  inside ranges like any other.
- ``leader_epoch`` is the partition leader's epoch the last stable offset was read under: at
  least the epoch of the record at ``end - 1``. It is stored with ``end`` by the publish, and
  the next reader's seek to ``end`` is validated with it (KIP-320): a log truncated below
  ``end`` under any later leader is found (ingest.consume.kafka).
- ``topic_id`` is Kafka's id of the topic (KIP-516) the log-end answer it was cut from named:
  the one stored with the partition's offset. Spark's reader keys its pooled consumers with it
  (ingest.builder.kafka_read), so a re-created topic's reads never meet the old log's.
- A sealed split is immutable; only its kill switch changes state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from ingest.splits.kill_switch import KillSwitch
from ingest_common.model import OffsetRange, TopicPartition


@dataclass(frozen=True, slots=True)
class SealedSplit:
    id: uuid.UUID
    tp: TopicPartition
    serial: int
    start: int
    end: int
    # The leader epoch of the partition when ``end`` was known stable (None: the broker gave none).
    leader_epoch: int | None
    # What the split's records are expected to hold (keys and values), from the bytes per
    # offset of the partition's earlier builds (ingest.consume.cutter): what max_bytes and
    # max_in_flight_bytes compare.
    estimated_bytes: int
    # When (``time.monotonic()`` of the cutting worker) the split's first offset was first known
    # to be in the log; and when it was cut.
    available_at: float
    sealed_at: float
    seal_reason: str
    kill_switch: KillSwitch = field(compare=False)
    # The partition's cut generation (see the module's invariants).
    epoch: int = 0
    # Kafka's id of the topic the split was cut from (None: not known).
    topic_id: str | None = None

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.tp, self.start, self.end)

    @property
    def offsets(self) -> int:
        """How many offsets the split covers (records, markers and holes alike)."""
        return self.end - self.start
