"""Consumed records as Arrow chunks: what the buffers and sealed splits hold instead of the
consumer's messages.

Holding librdkafka's message objects until their split is published costs more than reading
them (four allocations per record in memory no cache has seen, given back to the kernel and
faulted in again: docs/benchmarks.md, "Python cost per record"). So right after each poll
the consumer loop turns each run of one partition's messages into one :class:`Chunk` (the
four accessors staging needs, read once per record) and drops the messages; buffers take
chunks, sealing slices one where a split boundary falls inside it (zero-copy), and staging
concatenates a split's chunks into the staged table.

Invariants:
- A chunk's rows are its records in the order consumed; ``increasing`` says their offsets are
  strictly increasing (what librdkafka delivers; a buffer keeps only such records).
- What a chunk holds (``nbytes``) is counted from its columns: ``RECORD_BYTES`` and three
  validity bits per record plus its key's and value's bytes, and ``CHUNK_BYTES`` per chunk.
  A slice counts its own records; it shares its parent's memory, so after the older side of
  a cut is freed the newer side holds up to one chunk (one poll's run of a partition) more
  than it counts.
- A buffer merges its trailing small chunks (``MERGE_SMALL`` of fewer than ``SMALL_CHUNK``
  records), so a partition of a low rate does not hold a chunk's overhead per record.
- Every record's leader epoch is kept: the first and last record's when they are equal (the
  epochs of a partition's log never decrease along its offsets, so every record between has
  it too), else each record's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

CHUNK_SCHEMA = pa.schema(
    [
        ("_offset", pa.int64()),
        ("_timestamp", pa.timestamp("ms", tz="UTC")),
        ("_key", pa.binary()),
        ("_value", pa.binary()),
    ]
)
_TIMESTAMP = CHUNK_SCHEMA.field("_timestamp").type

# What a record holds in a chunk beyond its key's and value's bytes: its offset and timestamp
# (8 bytes each), the key's and the value's end offsets (4 each), and a validity bit for each of
# the timestamp, key and value (``_validity``).
RECORD_BYTES = 8 + 8 + 4 + 4
# What a chunk holds beyond its records: the Python and C++ objects of the chunk, its record
# batch, its arrays and their buffers, and each buffer's padding to 64 bytes (measured: 3.65 kB
# of resident memory per chunk of one 10-byte record, 200,000 of them).
CHUNK_BYTES = 3600


# A buffer merges its trailing chunks of fewer than SMALL_CHUNK records each once it holds
# MERGE_SMALL of them (a partition of a low rate gives a chunk of a record or two per poll):
# what they hold falls to what their records hold, for a copy of at most MERGE_SMALL small chunks.
SMALL_CHUNK = 256
MERGE_SMALL = 32


def _held(n: int, data: int) -> int:
    """What a chunk of ``n`` records with ``data`` bytes of keys and values holds."""
    return CHUNK_BYTES + RECORD_BYTES * n + (3 * n + 7) // 8 + data


class Record(Protocol):
    """The part of ``confluent_kafka.Message`` a chunk reads (fakes implement it in tests)."""

    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def leader_epoch(self) -> int | None:
        """The partition leader's epoch the record was written under (None: unknown)."""
        ...


def _ends(column: Any) -> npt.NDArray[np.int32]:
    """A binary column's end offsets, with its start: ``len + 1`` values, a view of its buffer."""
    start = column.offset
    view: npt.NDArray[np.int32] = np.frombuffer(column.buffers()[1], dtype=np.int32)
    return view[start : start + len(column) + 1]


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Chunk:
    """Records of one partition as Arrow columns (``CHUNK_SCHEMA``), never empty."""

    batch: Any  # pa.RecordBatch of CHUNK_SCHEMA
    # The offsets column as numpy (a view of the batch's buffer).
    offsets: npt.NDArray[np.int64]
    # Every record's leader epoch (-1: unknown), or the one they all share.
    epochs: int | tuple[int, ...]
    increasing: bool
    nbytes: int

    @staticmethod
    def of(batch: Any, epochs: int | tuple[int, ...]) -> Chunk:
        offsets: npt.NDArray[np.int64] = batch.column(0).to_numpy()
        keys, values = batch.column(2), batch.column(3)
        return Chunk(
            batch=batch,
            offsets=offsets,
            epochs=epochs,
            increasing=bool(np.all(offsets[1:] > offsets[:-1])),
            nbytes=_held(len(offsets), keys.total_values_length + values.total_values_length),
        )

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def first_offset(self) -> int:
        return int(self.offsets[0])

    @property
    def last_offset(self) -> int:
        return int(self.offsets[-1])

    @property
    def keys(self) -> Any:
        return self.batch.column(2)

    @property
    def values(self) -> Any:
        return self.batch.column(3)

    def timestamp_ms(self, i: int) -> int | None:
        """Record ``i``'s Kafka timestamp in ms (None: it has none)."""
        value: int | None = self.batch.column(1)[i].value
        return value

    def leader_epoch(self, i: int) -> int | None:
        """Record ``i``'s leader epoch (None: unknown)."""
        epoch = self.epochs if isinstance(self.epochs, int) else self.epochs[i]
        return epoch if epoch >= 0 else None

    def bytes_of(self, n: int) -> int:
        """What the first ``n`` records hold as a chunk of their own."""
        if n == len(self):
            return self.nbytes
        keys, values = _ends(self.keys), _ends(self.values)
        return _held(n, int(keys[n] - keys[0]) + int(values[n] - values[0]))

    def records_reaching(self, budget: int) -> int:
        """The fewest first records (at least one) whose :meth:`bytes_of` reaches ``budget``;
        ``len(self)`` when all of them stay below it."""
        keys, values = _ends(self.keys), _ends(self.values)
        n = np.arange(1, len(self) + 1)
        held = CHUNK_BYTES + RECORD_BYTES * n + (3 * n + 7) // 8 + (keys[1:] - keys[0]) + (values[1:] - values[0])
        return min(len(self), int(np.searchsorted(held, budget, side="left")) + 1)

    def slice(self, lo: int, hi: int) -> Chunk:
        """Records ``lo`` to ``hi`` (exclusive; not empty), sharing this chunk's memory."""
        if lo == 0 and hi == len(self):
            return self
        epochs = self.epochs if isinstance(self.epochs, int) else self.epochs[lo:hi]
        return Chunk.of(self.batch.slice(lo, hi - lo), _shared(epochs))

    def kept_above(self, floor: int | None) -> Chunk | None:
        """The records a buffer keeps, in their own memory: each above ``floor`` (None: any)
        and above every record kept before it. None when none is."""
        if self.increasing and (floor is None or self.first_offset > floor):
            return self
        keep: list[int] = []
        last = floor
        for i, offset in enumerate(self.offsets.tolist()):
            if last is None or offset > last:
                keep.append(i)
                last = offset
        if not keep:
            return None
        epochs = self.epochs if isinstance(self.epochs, int) else tuple(self.epochs[i] for i in keep)
        return Chunk.of(self.batch.take(pa.array(keep, pa.int64())), _shared(epochs))


def merged(chunks: Sequence[Chunk]) -> Chunk:
    """One chunk of the records of ``chunks``, in their order, in memory of its own."""
    epochs = tuple(e for c in chunks for e in ((c.epochs,) * len(c) if isinstance(c.epochs, int) else c.epochs))
    return Chunk.of(pa.concat_batches([c.batch for c in chunks]), _shared(epochs))


def _shared(epochs: int | tuple[int, ...]) -> int | tuple[int, ...]:
    """One epoch for all records when they share it."""
    if isinstance(epochs, tuple) and epochs.count(epochs[0]) == len(epochs):
        return epochs[0]
    return epochs


def _epoch(record: Record) -> int:
    epoch = record.leader_epoch()
    return -1 if epoch is None else epoch


def chunks_of(records: Sequence[Record]) -> tuple[Chunk, ...]:
    """``records`` (one partition's, as consumed) as chunks: one, or more when a column would
    not fit Arrow's 2 GiB of binary data. The consumer loop's hot path: one pass per column."""
    n = len(records)
    if not n:
        return ()
    offsets = pa.array([r.offset() for r in records], pa.int64())
    # Kind 0 is TIMESTAMP_NOT_AVAILABLE.
    stamps = pa.array([ms if kind else None for kind, ms in (r.timestamp() for r in records)], _TIMESTAMP)
    keys = pa.array([r.key() for r in records], pa.binary())
    values = pa.array([r.value() for r in records], pa.binary())
    if isinstance(keys, pa.ChunkedArray) or isinstance(values, pa.ChunkedArray):
        if n == 1:
            raise ValueError("a record's key or value exceeds 2 GiB")
        return chunks_of(records[: n // 2]) + chunks_of(records[n // 2 :])
    first, last = _epoch(records[0]), _epoch(records[-1])
    chunk = Chunk.of(pa.RecordBatch.from_arrays([offsets, stamps, keys, values], schema=CHUNK_SCHEMA), first)
    if first != last or not chunk.increasing:
        # Several epochs (a leader change inside the run), or records fetched before a seek.
        return (dataclasses.replace(chunk, epochs=_shared(tuple(_epoch(r) for r in records))),)
    return (chunk,)
