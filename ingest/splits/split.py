"""Per-partition buffers, sealed splits and their kill switches; records made in memory.

Buffers and splits hold records as Arrow chunks (ingest.splits.chunks), never the consumer's
messages.

Invariants:
- A buffer belongs to exactly one partition and one assignment (serial). It is
  dropped, never re-used, when the partition is revoked or lost.
- A buffer's ``start`` is the consumer position at which it began: the previous
  split's ``end`` or the offset the partition was seeked to. Consecutive splits
  of one assignment therefore tile the offsets with no gap and no overlap.
- A split ends after its last record, or further where Kafka said (end of partition)
  that everything before a higher offset was delivered: offsets that carry no record for
  a ``read_committed`` consumer (transaction markers, aborted records) are covered too,
  and a split may hold only such offsets.
- A sealed split is immutable; only its kill switch changes state.
- What a buffer or split holds (``size_bytes``) is the sum of its chunks' ``nbytes``: the one
  measure of size that ``max_bytes``, ``max_in_flight_bytes`` and the byte metrics use.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ingest.errors import SplitKilled
from ingest.spec import SplitLimits
from ingest.splits.chunks import MERGE_SMALL, SMALL_CHUNK, Chunk, merged
from ingest_common.model import OffsetRange, TopicPartition


class SyntheticRecord:
    """A record made in memory rather than consumed: the builder's warm-up, the benchmarks'
    splits, and the one record double of the tests (the in-memory consumer delivers it too,
    so it names its topic and partition as a consumed message does)."""

    __slots__ = ("_key", "_leader_epoch", "_offset", "_partition", "_timestamp_ms", "_topic", "_value")

    def __init__(
        self,
        offset: int,
        value: bytes | None = b"{}",
        key: bytes | None = None,
        *,
        timestamp_ms: int = 1_700_000_000_000,
        topic: str = "",
        partition: int = 0,
        leader_epoch: int | None = None,
    ) -> None:
        self._leader_epoch = leader_epoch
        self._offset = offset
        self._value = value
        self._key = key
        self._timestamp_ms = timestamp_ms
        self._topic = topic
        self._partition = partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp_ms)  # TIMESTAMP_CREATE_TIME

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def __len__(self) -> int:
        return len(self._value or b"")  # as confluent-kafka's Message: the value only

    def __repr__(self) -> str:
        return f"SyntheticRecord({self._topic}[{self._partition}]@{self._offset}, {self._value!r})"


class KillSwitch:
    """Tripped once, never reset. Publishing holds it (``hold``) across the commit, so
    once ``trip`` returns no commit of this split can start; a commit already running
    finishes first (bounded by ``timeout``: past it the metastore's serial check is the
    only fence, which is always sufficient for correctness)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        return self._reason

    @property
    def tripped(self) -> bool:
        return self._reason is not None

    def on_trip(self, callback: Callable[[str], None]) -> None:
        """Run ``callback(reason)`` when tripped (at once if already tripped)."""
        run_now = False
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
            else:
                run_now = True
        if run_now:
            callback(self._reason or "")

    def trip(self, reason: str, timeout: float = 5.0) -> bool:
        """Trip the switch. Returns False when a commit in progress did not finish in time."""
        acquired = self._lock.acquire(timeout=timeout)
        try:
            if self._reason is not None:
                return acquired
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
        finally:
            if acquired:
                self._lock.release()
        for callback in callbacks:
            callback(reason)
        return acquired

    def check(self) -> None:
        if self._reason is not None:
            raise SplitKilled(self._reason)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the switch from tripping while the body runs; raise if already tripped."""
        with self._lock:
            if self._reason is not None:
                raise SplitKilled(self._reason)
            yield


@dataclass(frozen=True, slots=True)
class SealedSplit:
    id: uuid.UUID
    tp: TopicPartition
    serial: int
    start: int
    end: int
    # The records, in offset order (none: the split covers only offsets without records).
    chunks: tuple[Chunk, ...]
    size_bytes: int
    first_record_at: float
    sealed_at: float
    seal_reason: str
    kill_switch: KillSwitch = field(compare=False)
    # Bumped by the loop each time it rewinds the partition: outcomes of splits from an
    # older epoch are stale and must not trigger another rewind.
    epoch: int = 0

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.tp, self.start, self.end)

    @property
    def leader_epoch(self) -> int | None:
        """The leader epoch of the record at ``end - 1``, stored with ``end`` by the publish so
        the next reader can have the position validated (KIP-320). None when ``end - 1`` holds
        no record this consumer received (a transaction marker, an aborted record): the epoch
        of an earlier record could end before ``end`` and read as a truncation."""
        if not self.chunks:
            return None
        last = self.chunks[-1]
        if last.last_offset != self.end - 1:
            return None
        return last.leader_epoch(len(last) - 1)

    def first_timestamp_ms(self) -> int | None:
        """The first record's Kafka timestamp (None: no records, or it has none)."""
        return self.chunks[0].timestamp_ms(0) if self.chunks else None

    def last_timestamp_ms(self) -> int | None:
        """The last record's Kafka timestamp (None: no records, or it has none)."""
        return self.chunks[-1].timestamp_ms(len(self.chunks[-1]) - 1) if self.chunks else None

    def __len__(self) -> int:
        return sum(map(len, self.chunks))


class PartitionBuffer:
    """Records of one partition since the last seal, as the chunks they came in (or slices)."""

    __slots__ = (
        "_chunks",
        "_count",
        "_delivered_to",
        "_first_at",
        "_last",
        "_size",
        "_small",
        "epoch",
        "position",
        "serial",
        "tp",
    )

    def __init__(self, tp: TopicPartition, serial: int, position: int | None, epoch: int = 0) -> None:
        self.tp = tp
        self.serial = serial
        self.epoch = epoch
        # None until the first record arrives when the partition started at a logical
        # position (earliest/latest) rather than a stored offset.
        self.position = position
        self._chunks: list[Chunk] = []
        # How many of the last chunks have fewer than SMALL_CHUNK records each.
        self._small = 0
        self._count = 0
        self._size = 0
        self._first_at = 0.0
        # Offset of the last record appended (-1: none).
        self._last = -1
        # Kafka's end of partition, when it lies past the last record: every offset below it
        # was delivered (-1: not known).
        self._delivered_to = -1

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._size

    def first_timestamp_ms(self) -> int | None:
        return self._chunks[0].timestamp_ms(0) if self._chunks else None

    def take(self, chunk: Chunk, now: float, limits: SplitLimits) -> tuple[Chunk | None, int, int]:
        """Append the records of ``chunk`` (one partition's, as the consumer delivered them)
        until the buffer reaches ``max_records`` or ``max_bytes``: the record that reaches
        either is appended, the rest is returned (a slice: seal, then take it). A record before
        the position or at or below the last one appended is dropped: that happens only for
        messages fetched before a seek. Returns the rest (None: every record was looked at),
        and the records and bytes (``Chunk.nbytes``) appended."""
        floor = self._last if self._count else (None if self.position is None else self.position - 1)
        kept = chunk.kept_above(floor)
        if kept is None:
            return None, 0, 0
        n = len(kept)
        # At least one record: a buffer already at a limit (a lowered one) still moves on.
        count = min(n, max(1, limits.max_records - self._count))
        size = kept.bytes_of(count)
        if self._size + size >= limits.max_bytes:
            count = min(count, kept.records_reaching(limits.max_bytes - self._size))
            size = kept.bytes_of(count)
        head = kept.slice(0, count)
        if not self._count:
            if self.position is None:
                self.position = head.first_offset
            self._first_at = now
        self._chunks.append(head)
        self._count += count
        self._last = head.last_offset
        self._size += size
        self._small = self._small + 1 if count < SMALL_CHUNK else 0
        if self._small >= MERGE_SMALL:
            self._merge_small()
        return (kept.slice(count, n) if count < n else None), count, size

    def _merge_small(self) -> None:
        """The trailing small chunks become one (copied): what the buffer holds falls by their
        overhead, counted at once."""
        small = self._chunks[-self._small :]
        one = merged(small)
        self._size += one.nbytes - sum(c.nbytes for c in small)
        self._chunks[-self._small :] = [one]
        self._small = 1 if len(one) < SMALL_CHUNK else 0

    def full(self, limits: SplitLimits) -> str | None:
        """The size limit the buffer reached, if any."""
        if self._count >= limits.max_records:
            return "records"
        if self._size >= limits.max_bytes:
            return "bytes"
        return None

    def delivered_to(self, end: int) -> None:
        """The consumer reached the end of the partition at ``end`` (librdkafka's
        PARTITION_EOF, in order with the records): offsets between the last record and
        ``end`` hold nothing this consumer will ever receive."""
        reached = self._last + 1 if self._count else self.position
        if reached is None or end <= max(reached, self._delivered_to):
            return
        self._delivered_to = end

    @property
    def end(self) -> int | None:
        """Where a split sealed now would end (None: nothing to seal)."""
        if self._count:
            return max(self._last + 1, self._delivered_to)
        if self.position is not None and self._delivered_to > self.position:
            return self._delivered_to
        return None

    def should_seal(self, limits: SplitLimits, now: float) -> str | None:
        if not self._count:
            # Only offsets without records (markers at the tail of a partition): sealed at
            # once, so the stored offset reaches the end and no lag is left behind.
            return "no_records" if self.end is not None else None
        if reason := self.full(limits):
            return reason
        if now - self._first_at >= limits.max_age_s:
            return "age"
        return None

    def seal(self, reason: str, now: float | None = None) -> SealedSplit:
        end = self.end
        assert end is not None and self.position is not None
        split = SealedSplit(
            id=uuid.uuid4(),
            tp=self.tp,
            serial=self.serial,
            start=self.position,
            end=end,
            chunks=tuple(self._chunks),
            size_bytes=self._size,
            first_record_at=self._first_at,
            sealed_at=time.monotonic() if now is None else now,
            seal_reason=reason,
            kill_switch=KillSwitch(),
            epoch=self.epoch,
        )
        self.position = split.end
        self._chunks = []
        self._small = 0
        self._count = 0
        self._size = 0
        self._last = -1
        self._delivered_to = -1
        return split
