import itertools
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from ingest.errors import SplitKilled
from ingest.spec import SplitLimits
from ingest.splits.chunks import CHUNK_BYTES, MERGE_SMALL, RECORD_BYTES, Chunk, Record, chunks_of
from ingest.splits.split import KillSwitch, PartitionBuffer, SealedSplit, SyntheticRecord
from ingest_common.model import TopicPartition

TP = TopicPartition("t", 0)
UNBOUNDED = SplitLimits(max_records=10**9, max_bytes=10**18, max_age_s=3600.0)
# What one record with the default value (2 bytes) holds in a chunk, but its validity bits.
HELD = RECORD_BYTES + 2


def bits(n: int) -> int:
    """The bytes of ``n`` records' validity bits (three each)."""
    return (3 * n + 7) // 8


def chunk(records: Sequence[Record]) -> Chunk:
    (one,) = chunks_of(records)
    return one


def take_all(buf: PartitionBuffer, records: Sequence[Record] | Chunk, limits: SplitLimits) -> list[SealedSplit]:
    """The consumer loop's path: ``records`` as one chunk, taken until every record was looked
    at, sealing each time the buffer fills."""
    sealed = []
    rest: Chunk | None = records if isinstance(records, Chunk) else chunk(records)
    while rest is not None:
        rest, _, _ = buf.take(rest, 0.0, limits)
        if reason := buf.full(limits):
            sealed.append(buf.seal(reason, 0.0))
    return sealed


def offsets(split: SealedSplit) -> list[int]:
    return [o for c in split.chunks for o in c.offsets.tolist()]


def add(buf: PartitionBuffer, offset: int, size: int) -> bool:
    """One record of ``size`` bytes through the consumer loop's path (``take``); True if kept."""
    _, added, _ = buf.take(chunk([SyntheticRecord(offset, b"x" * size)]), 0.0, UNBOUNDED)
    return added == 1


def test_consecutive_splits_tile_offsets_even_across_gaps() -> None:
    buf = PartitionBuffer(TP, serial=3, position=10)
    for offset in (10, 11, 14):  # 12 and 13 do not exist (e.g. transaction markers)
        assert add(buf, offset, 1)
    first = buf.seal("records")
    assert (first.start, first.end, first.serial, len(first)) == (10, 15, 3, 3)
    assert add(buf, 17, 1)
    second = buf.seal("records")
    assert (second.start, second.end) == (15, 18)


def test_records_before_the_position_or_repeated_are_dropped() -> None:
    buf = PartitionBuffer(TP, serial=1, position=100)
    assert not add(buf, 99, 1)
    assert add(buf, 100, 1)
    assert not add(buf, 100, 1)
    assert len(buf) == 1


def test_logical_start_takes_the_first_record_offset() -> None:
    buf = PartitionBuffer(TP, serial=1, position=None)
    add(buf, 42, 1)
    assert buf.seal("age").start == 42


def test_take_stops_at_the_record_that_fills_the_buffer_and_the_rest_starts_the_next_split() -> None:
    limits = SplitLimits(max_records=3, max_bytes=10_000, max_age_s=60.0)
    run = chunk([SyntheticRecord(o) for o in range(10, 15)])
    buf = PartitionBuffer(TP, serial=1, position=10)
    rest, added, size = buf.take(run, now=1.0, limits=limits)
    assert (added, size) == (3, CHUNK_BYTES + 3 * HELD + bits(3)) and rest is not None
    assert buf.full(limits) == "records"
    first = buf.seal("records")
    assert (first.start, first.end, offsets(first)) == (10, 13, [10, 11, 12])
    assert buf.take(rest, now=1.0, limits=limits) == (None, 2, CHUNK_BYTES + 2 * HELD + bits(2))
    assert buf.full(limits) is None
    assert (buf.seal("age").start, buf.end) == (13, None)


def test_take_drops_records_before_the_position_or_repeated_and_counts_only_what_it_kept() -> None:
    limits = SplitLimits(max_records=100, max_bytes=10_000, max_age_s=60.0)
    run = chunk([SyntheticRecord(o) for o in (98, 99, 100, 100, 101)])
    buf = PartitionBuffer(TP, serial=1, position=100)
    assert buf.take(run, now=1.0, limits=limits) == (None, 2, CHUNK_BYTES + 2 * HELD + bits(2))
    split = buf.seal("age")
    assert offsets(split) == [100, 101] and split.size_bytes == CHUNK_BYTES + 2 * HELD + bits(2)


def test_take_stops_on_bytes_and_a_logical_start_takes_the_first_offset() -> None:
    run = chunk([SyntheticRecord(o, b"abc") for o in (42, 43, 44)])
    each = RECORD_BYTES + 3
    limits = SplitLimits(max_records=100, max_bytes=CHUNK_BYTES + 2 * each + bits(2) - 1, max_age_s=60.0)
    buf = PartitionBuffer(TP, serial=1, position=None)
    rest, added, size = buf.take(run, now=1.0, limits=limits)
    assert (added, size, rest is not None and rest.first_offset) == (2, CHUNK_BYTES + 2 * each + bits(2), 44)
    assert buf.full(limits) == "bytes"
    assert (buf.seal("bytes").start, buf.position) == (42, 44)


def test_seal_reasons() -> None:
    limits = SplitLimits(max_records=3, max_bytes=CHUNK_BYTES + HELD + 100, max_age_s=5.0)
    buf = PartitionBuffer(TP, serial=1, position=0)
    assert buf.should_seal(limits, now=100.0) is None  # empty never seals
    add(buf, 0, 10)
    assert buf.should_seal(limits, now=1.0) is None
    assert buf.should_seal(limits, now=5.0) == "age"
    add(buf, 1, 1)
    assert buf.should_seal(limits, now=1.0) == "bytes"
    add(buf, 2, 1)
    assert buf.should_seal(limits, now=1.0) == "records"


def test_kill_switch_trips_once_and_runs_callbacks() -> None:
    switch = KillSwitch()
    seen: list[str] = []
    switch.on_trip(seen.append)
    assert switch.trip("revoke")
    switch.trip("lost")
    assert switch.reason == "revoke"
    switch.on_trip(seen.append)  # registered after the trip: runs at once
    assert seen == ["revoke", "revoke"]
    with pytest.raises(SplitKilled):
        switch.check()
    with pytest.raises(SplitKilled), switch.hold():
        pass


@contextmanager
def commit_in_progress(switch: KillSwitch) -> Iterator[threading.Event]:
    """A thread holds the switch (as a publish does across its commit) until the yielded
    event is set."""
    entered = threading.Event()
    release = threading.Event()

    def commit() -> None:
        with switch.hold():
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=commit)
    thread.start()
    assert entered.wait(5)
    try:
        yield release
    finally:
        release.set()
        thread.join()


def test_trip_waits_for_a_commit_in_progress() -> None:
    switch = KillSwitch()
    with commit_in_progress(switch) as release:
        threading.Timer(0.2, release.set).start()
        started = time.monotonic()
        assert switch.trip("revoke", timeout=5)
        assert time.monotonic() - started >= 0.15  # could not trip while the commit held it


def test_trip_gives_up_after_its_timeout_but_still_trips() -> None:
    switch = KillSwitch()
    with commit_in_progress(switch):
        assert not switch.trip("revoke", timeout=0.05)
        assert switch.tripped


def test_the_end_of_partition_extends_a_split_over_offsets_without_records() -> None:
    # Offsets 12 and 13 are a transaction's commit marker and an aborted record: a
    # read_committed consumer never receives them, and the EOF says it read through 14.
    buf = PartitionBuffer(TP, serial=1, position=10)
    add(buf, 10, 1)
    add(buf, 11, 1)
    buf.delivered_to(14)
    split = buf.seal("age")
    assert (split.start, split.end, len(split)) == (10, 14, 2)
    assert buf.position == 14


def test_an_end_of_partition_at_or_below_the_last_record_changes_nothing() -> None:
    buf = PartitionBuffer(TP, serial=1, position=0)
    add(buf, 0, 1)
    add(buf, 5, 1)
    buf.delivered_to(6)  # the plain log end: right after the last record
    buf.delivered_to(3)  # stale
    assert buf.seal("age").end == 6
    limits = SplitLimits(max_records=10, max_bytes=100, max_age_s=5.0)
    buf.delivered_to(6)
    assert buf.should_seal(limits, now=1.0) is None and buf.end is None


def test_offsets_past_a_seal_that_carry_no_record_become_a_split_of_their_own_at_once() -> None:
    limits = SplitLimits(max_records=2, max_bytes=100, max_age_s=60.0)
    buf = PartitionBuffer(TP, serial=1, position=0)
    add(buf, 0, 1)
    add(buf, 1, 1)
    assert buf.seal("records").end == 2
    buf.delivered_to(3)  # offset 2 is the transaction's commit marker, the last in the log
    assert buf.should_seal(limits, now=0.0) == "no_records"
    split = buf.seal("no_records")
    assert (split.start, split.end, len(split)) == (2, 3, 0)


def test_an_end_of_partition_before_the_first_record_of_a_logical_start_is_ignored() -> None:
    # Started at "earliest" with nothing stored: where the split would start is unknown.
    buf = PartitionBuffer(TP, serial=1, position=None)
    buf.delivered_to(7)
    assert buf.end is None


def test_a_split_boundary_inside_a_chunk_slices_it_without_copying() -> None:
    """A chunk of 10 records cut by max_records=4: splits of 4, 4 and 2, each a slice of the
    chunk's own memory; together they hold every record once, counted as the chunk plus one
    chunk's overhead per extra piece."""
    records = [SyntheticRecord(o, b"v%d" % o, b"k" if o % 2 else None) for o in range(100, 110)]
    whole = chunk(records)
    limits = SplitLimits(max_records=4, max_bytes=10**9, max_age_s=60.0)
    buf = PartitionBuffer(TP, serial=1, position=100)
    splits = [*take_all(buf, whole, limits), buf.seal("age", 0.0)]
    assert [(s.start, s.end, len(s)) for s in splits] == [(100, 104, 4), (104, 108, 4), (108, 110, 2)]
    assert [o for s in splits for o in offsets(s)] == list(range(100, 110))
    values = [v for s in splits for c in s.chunks for v in c.values.to_pylist()]
    keys = [k for s in splits for c in s.chunks for k in c.keys.to_pylist()]
    assert values == [r.value() for r in records] and keys == [r.key() for r in records]
    data = whole.values.buffers()[2].address
    assert all(c.values.buffers()[2].address == data for s in splits for c in s.chunks)  # zero-copy
    assert [s.size_bytes for s in splits] == [whole.slice(lo, hi).nbytes for lo, hi in ((0, 4), (4, 8), (8, 10))]
    # Each piece counts its validity bits in whole bytes: 2 + 2 + 1 against 4 for the chunk.
    assert sum(s.size_bytes for s in splits) == whole.nbytes + 2 * CHUNK_BYTES + 1


def test_a_gap_inside_a_chunk_stays_inside_the_split_that_covers_it() -> None:
    """Offsets 12, 13 and 16 carry no record (compaction, transaction markers): the splits a
    chunk is cut into tile the offsets with the gaps inside them, never between them."""
    records = [SyntheticRecord(o) for o in (10, 11, 14, 15, 17, 18)]
    for cut in (1, 2, 3, 4, 5):
        buf = PartitionBuffer(TP, serial=1, position=10)
        splits = take_all(buf, records, SplitLimits(max_records=cut, max_bytes=10**9, max_age_s=60.0))
        if len(buf):
            splits.append(buf.seal("age", 0.0))
        ranges = [(s.start, s.end) for s in splits]
        assert ranges[0][0] == 10 and ranges[-1][1] == 19, (cut, ranges)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), (cut, ranges)
        assert [o for s in splits for o in offsets(s)] == [r.offset() for r in records], cut
        assert all(offsets(s)[0] >= s.start and offsets(s)[-1] == s.end - 1 for s in splits), (cut, ranges)


def test_a_splits_leader_epoch_is_its_last_records_wherever_the_chunk_is_cut() -> None:
    records = [SyntheticRecord(o, leader_epoch=5 if o < 3 else 7) for o in range(6)]
    buf = PartitionBuffer(TP, serial=1, position=0)
    splits = take_all(buf, records, SplitLimits(max_records=2, max_bytes=10**9, max_age_s=60.0))
    assert [(s.end, s.leader_epoch) for s in splits] == [(2, 5), (4, 7), (6, 7)]
    buf = PartitionBuffer(TP, serial=1, position=0)
    add(buf, 0, 1)
    buf.delivered_to(3)  # offsets 1 and 2 hold no record: epoch of offset 2 unknown
    assert buf.seal("age").leader_epoch is None


def test_a_chunks_byte_count_is_what_arrow_holds_for_its_records() -> None:
    """``nbytes`` against Arrow's own measure of the columns (its ``nbytes``, which counts a
    slice's elements only), whole and sliced: never less; more by at most CHUNK_BYTES (objects
    Arrow does not count) and a byte (the validity bits of a column without nulls, which Arrow
    leaves out, and their rounding)."""
    rng = random.Random(7)
    records = [
        SyntheticRecord(o, rng.choice((None, b"v" * rng.randrange(300))), rng.choice((None, b"k" * 20)))
        for o in range(1000)
    ]
    whole = chunk(records)
    for piece in (whole, whole.slice(0, 1), whole.slice(100, 900), whole.slice(999, 1000)):
        columns = piece.batch.nbytes
        assert columns <= piece.nbytes <= columns + CHUNK_BYTES + 1 + len(piece) // 8, (len(piece), piece.nbytes)
    for n in (1, 2, 500, 999, 1000):
        assert whole.bytes_of(n) == whole.slice(0, n).nbytes
        assert whole.records_reaching(whole.bytes_of(n)) == n
        assert whole.records_reaching(whole.bytes_of(n) + 1) == min(n + 1, 1000)


class _Reference:
    """The buffer's semantics record by record, as a model: each record kept if it is above
    the position and the last kept one; a piece of a chunk costs CHUNK_BYTES once; a buffer is
    sealed at the record that reaches max_records or max_bytes."""

    def __init__(self, position: int | None) -> None:
        self.position = position
        self.held: list[int] = []
        self.size = 0
        self.sealed: list[tuple[int, int, list[int], int]] = []

    def take(self, records: Sequence[Record], limits: SplitLimits) -> None:
        piece = 0  # records of this chunk in the buffer (0: the next one starts a piece)
        for r in records:
            offset = r.offset()
            assert offset is not None
            if self.held and offset <= self.held[-1]:
                continue
            if not self.held and self.position is not None and offset < self.position:
                continue
            if not self.held and self.position is None:
                self.position = offset
            if not piece:
                self.size += CHUNK_BYTES
            piece += 1
            self.held.append(offset)
            self.size += RECORD_BYTES + len(r.key() or b"") + len(r.value() or b"")
            self.size += bits(piece) - bits(piece - 1)  # the piece's validity bits, in whole bytes
            if len(self.held) >= limits.max_records or self.size >= limits.max_bytes:
                assert self.position is not None
                self.sealed.append((self.position, self.held[-1] + 1, self.held, self.size))
                self.position, self.held, self.size, piece = self.held[-1] + 1, [], 0, 0


def test_take_cuts_chunks_exactly_as_the_record_by_record_model() -> None:
    """Seeded random chunks (keys or none, values or none, offsets with holes, repeats and
    records from before the position): the splits sealed, their records and byte counts, and
    what is left in the buffer are the model's."""
    rng = random.Random(29)
    for case in range(300):
        start = rng.randrange(5, 50)
        offset, chunks = start - rng.randrange(0, 3), []
        for _ in range(rng.randrange(1, 6)):
            records = []
            for _ in range(rng.randrange(1, 40)):
                step = rng.choice((1, 1, 1, 2, 5, 0, -1)) if case % 3 == 0 else rng.choice((1, 1, 2))
                offset = max(0, offset + step)
                key = rng.choice((None, b"", b"k" * rng.randrange(1, 40)))
                value = rng.choice((None, b"v" * rng.randrange(0, 300)))
                records.append(SyntheticRecord(offset, value, key))
            chunks.append(records)
        limits = SplitLimits(
            max_records=rng.randrange(1, 80), max_bytes=rng.randrange(CHUNK_BYTES, 4 * CHUNK_BYTES), max_age_s=60.0
        )
        position = rng.choice((None, start))
        buf, model = PartitionBuffer(TP, 1, position), _Reference(position)
        got = []
        for records in chunks:
            got += [(s.start, s.end, offsets(s), s.size_bytes) for s in take_all(buf, records, limits)]
            model.take(records, limits)
        assert got == model.sealed, case
        assert (buf.position, len(buf), buf.size_bytes) == (model.position, len(model.held), model.size), case


def test_a_low_rate_partitions_small_chunks_are_merged_and_counted_as_merged() -> None:
    """A record or two per poll (a partition of a low rate): every MERGE_SMALL small chunks
    become one in memory of its own, so the buffer holds what its records hold, not a chunk's
    overhead per record; offsets, gaps, values and leader epochs are kept."""
    offsets_in = [o for o in range(0, 300) if o % 7]  # gaps: every 7th offset carries no record
    buf = PartitionBuffer(TP, serial=1, position=0)
    for i, offset in enumerate(offsets_in):
        record = SyntheticRecord(offset, b"v%d" % offset, leader_epoch=1 if i < 150 else 2)
        assert buf.take(chunk([record]), 0.0, UNBOUNDED)[1] == 1
    split = buf.seal("age", 0.0)
    assert offsets(split) == offsets_in and (split.start, split.end) == (0, 300)
    assert [v for c in split.chunks for v in c.values.to_pylist()] == [b"v%d" % o for o in offsets_in]
    assert len(split.chunks) <= MERGE_SMALL
    assert split.size_bytes == sum(c.nbytes for c in split.chunks) < 2 * MERGE_SMALL * CHUNK_BYTES
    assert split.leader_epoch == 2
    epochs = [c.leader_epoch(i) for c in split.chunks for i in range(len(c))]
    assert epochs == [1] * 150 + [2] * (len(offsets_in) - 150)
