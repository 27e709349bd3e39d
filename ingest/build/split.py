"""Per-partition buffers, sealed splits and their kill switches; records made in memory.

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
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, cast

from ingest.errors import SplitKilled
from ingest.spec import SplitLimits
from ingest_common.model import OffsetRange, TopicPartition


class Record(Protocol):
    """The part of ``confluent_kafka.Message`` a split needs (fakes implement it in tests)."""

    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...
    def leader_epoch(self) -> int | None:
        """The partition leader's epoch the record was written under (None: unknown)."""
        ...

    def __len__(self) -> int:
        """The value's length (0 without one), as confluent-kafka's Message defines it."""
        ...


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


# What a consumed record holds beyond the bytes of its value, key and headers, measured with
# tracemalloc on confluent-kafka 2.16 messages read from a broker (CPython 3.11, 64-bit): the
# Message object (136 bytes), its value's bytes object (33 + length; counted for a tombstone
# too), its own copy of the topic name (a str of 49 + length; the length is added per record)
# and its slot in the buffer's list (8).
RECORD_OVERHEAD_BYTES = 136 + 33 + 49 + 8
# A key or a header value: a bytes object of 33 + length.
BYTES_OVERHEAD = 33
# Headers, once asked for: a list (56), and per header a slot (8), a (name, value) tuple (56)
# and the name's str (49 + length).
HEADERS_OVERHEAD = 56
HEADER_OVERHEAD = 8 + 56 + 49


def held_bytes(record: Record, topic: str) -> int:
    """The memory a buffered record of ``topic`` holds: the one measure of size that
    ``max_bytes``, ``max_in_flight_bytes`` and the byte metrics use (values alone would let
    small values or large keys hold several times those bounds). Asking for a record's
    headers converts them to Python objects once (librdkafka's copy is freed then), which is
    what is counted. On the consumer loop's hot path: kept to the calls it needs."""
    size = RECORD_OVERHEAD_BYTES + len(topic) + len(record)
    key = record.key()
    if key is not None:
        size += BYTES_OVERHEAD + len(key)
    headers = record.headers()
    if headers:
        size += _headers_bytes(headers)
    return size


def _headers_bytes(headers: list[tuple[str, bytes | None]]) -> int:
    """What a record's (non-empty) headers hold as Python objects."""
    size = HEADERS_OVERHEAD
    for name, data in headers:
        size += HEADER_OVERHEAD + len(name) + (BYTES_OVERHEAD + len(data) if data is not None else 0)
    return size


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
    records: tuple[Record, ...]
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
        if not self.records:
            return None
        last = self.records[-1]
        if last.offset() != self.end - 1:
            return None
        epoch = last.leader_epoch()
        return epoch if epoch is not None and epoch >= 0 else None

    def __len__(self) -> int:
        return len(self.records)


class PartitionBuffer:
    """Records of one partition since the last seal."""

    __slots__ = ("_delivered_to", "_first_at", "_last", "_records", "_size", "epoch", "position", "serial", "tp")

    def __init__(self, tp: TopicPartition, serial: int, position: int | None, epoch: int = 0) -> None:
        self.tp = tp
        self.serial = serial
        self.epoch = epoch
        # None until the first record arrives when the partition started at a logical
        # position (earliest/latest) rather than a stored offset.
        self.position = position
        self._records: list[Record] = []
        self._size = 0
        self._first_at = 0.0
        # Offset of the last record appended (-1: none); kept to avoid a call per record.
        self._last = -1
        # Kafka's end of partition, when it lies past the last record: every offset below it
        # was delivered (-1: not known).
        self._delivered_to = -1

    def __len__(self) -> int:
        return len(self._records)

    @property
    def size_bytes(self) -> int:
        return self._size

    def first_timestamp_ms(self) -> int | None:
        return self._records[0].timestamp()[1] if self._records else None

    def take(
        self, records: Sequence[Record], lo: int, hi: int, now: float, limits: SplitLimits
    ) -> tuple[int, int, int]:
        """Append ``records[lo:hi]`` (one partition's, as the consumer delivered them) until
        the buffer reaches ``max_records`` or ``max_bytes``. A record before the position or at
        or below the last one appended is dropped: that happens only for messages fetched
        before a seek. Returns the index after the last record looked at, and the records and
        bytes (:func:`held_bytes`) appended. The consumer loop's hot path: one call per run of a
        partition's records, and the records counted column by column (each accessor over the
        run at once) whenever the whole run is kept; a run that drops a record or reaches
        ``max_bytes`` is taken record by record."""
        room = limits.max_records - len(self._records)
        if room > 0 and lo < hi:
            stop = min(hi, lo + room)
            chunk = records[lo:stop]
            added = self._take_whole(chunk, now, limits)
            if added is not None:
                return stop, len(chunk), added
        return self._take_each(records, lo, hi, now, limits)

    def _take_whole(self, chunk: Sequence[Record], now: float, limits: SplitLimits) -> int | None:
        """Append every record of ``chunk`` if each is kept and they stay below ``max_bytes``;
        returns the bytes appended, or None (nothing appended)."""
        # A delivered record always has an offset (None only on error events, which the
        # consumer boundary takes out of the batch); a None here fails the comparison below.
        offsets = cast("list[int]", [record.offset() for record in chunk])
        first = offsets[0]
        if self._records:
            if first <= self._last:
                return None
        elif self.position is not None and first < self.position:
            return None
        # Strictly increasing: every record after the first is kept too.
        if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
            return None
        n = len(chunk)
        # held_bytes over the chunk, column by column.
        size = n * (RECORD_OVERHEAD_BYTES + len(self.tp.topic)) + sum(map(len, chunk))
        keys = [record.key() for record in chunk]
        with_keys = n - keys.count(None)
        if with_keys:
            size += with_keys * BYTES_OVERHEAD + sum(map(len, filter(None, keys)))
        headers = [record.headers() for record in chunk]
        if any(headers):
            size += sum(_headers_bytes(h) for h in headers if h)
        if self._size + size >= limits.max_bytes:
            return None
        if not self._records:
            if self.position is None:
                self.position = first
            self._first_at = now
        self._records.extend(chunk)
        self._last = offsets[-1]
        self._size += size
        return size

    def _take_each(
        self, records: Sequence[Record], lo: int, hi: int, now: float, limits: SplitLimits
    ) -> tuple[int, int, int]:
        """:meth:`take` record by record: drops what is not kept, stops at the record that
        fills the buffer."""
        kept = self._records
        last = self._last
        size = self._size
        before = (len(kept), size)
        max_records, max_bytes = limits.max_records, limits.max_bytes
        topic = self.tp.topic
        i = lo
        while i < hi:
            record = records[i]
            i += 1
            offset = record.offset()
            assert offset is not None
            if kept:
                if offset <= last:
                    continue
            else:
                if self.position is None:
                    self.position = offset
                elif offset < self.position:
                    continue
                self._first_at = now
            kept.append(record)
            last = offset
            size += held_bytes(record, topic)
            if len(kept) >= max_records or size >= max_bytes:
                break
        self._last = last
        self._size = size
        return i, len(kept) - before[0], size - before[1]

    def full(self, limits: SplitLimits) -> str | None:
        """The size limit the buffer reached, if any."""
        if len(self._records) >= limits.max_records:
            return "records"
        if self._size >= limits.max_bytes:
            return "bytes"
        return None

    def delivered_to(self, end: int) -> None:
        """The consumer reached the end of the partition at ``end`` (librdkafka's
        PARTITION_EOF, in order with the records): offsets between the last record and
        ``end`` hold nothing this consumer will ever receive."""
        reached = self._last + 1 if self._records else self.position
        if reached is None or end <= max(reached, self._delivered_to):
            return
        self._delivered_to = end

    @property
    def end(self) -> int | None:
        """Where a split sealed now would end (None: nothing to seal)."""
        if self._records:
            return max(self._last + 1, self._delivered_to)
        if self.position is not None and self._delivered_to > self.position:
            return self._delivered_to
        return None

    def should_seal(self, limits: SplitLimits, now: float) -> str | None:
        if not self._records:
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
            records=tuple(self._records),
            size_bytes=self._size,
            first_record_at=self._first_at,
            sealed_at=time.monotonic() if now is None else now,
            seal_reason=reason,
            kill_switch=KillSwitch(),
            epoch=self.epoch,
        )
        self.position = split.end
        self._records = []
        self._size = 0
        self._last = -1
        self._delivered_to = -1
        return split
