import random
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Message

from ingest.build.split import KillSwitch, PartitionBuffer, SyntheticRecord, held_bytes
from ingest.errors import SplitKilled
from ingest.spec import SplitLimits
from ingest_common.model import TopicPartition

TP = TopicPartition("t", 0)
UNBOUNDED = SplitLimits(max_records=10**9, max_bytes=10**18, max_age_s=3600.0)
# What one SyntheticRecord with the default value holds.
HELD = held_bytes(SyntheticRecord(0), TP.topic)


def add(buf: PartitionBuffer, offset: int, size: int) -> bool:
    """One record of ``size`` bytes through the consumer loop's path (``take``); True if kept."""
    _, added, _ = buf.take([SyntheticRecord(offset, b"x" * size)], 0, 1, 0.0, UNBOUNDED)
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
    run = [SyntheticRecord(o) for o in range(10, 15)]
    buf = PartitionBuffer(TP, serial=1, position=10)
    assert buf.take(run, 0, len(run), now=1.0, limits=limits) == (3, 3, 3 * HELD)
    assert buf.full(limits) == "records"
    first = buf.seal("records")
    assert (first.start, first.end, [r.offset() for r in first.records]) == (10, 13, [10, 11, 12])
    assert buf.take(run, 3, len(run), now=1.0, limits=limits) == (5, 2, 2 * HELD)
    assert buf.full(limits) is None
    assert (buf.seal("age").start, buf.end) == (13, None)


def test_take_drops_records_before_the_position_or_repeated_and_counts_only_what_it_kept() -> None:
    limits = SplitLimits(max_records=100, max_bytes=10_000, max_age_s=60.0)
    run = [SyntheticRecord(o) for o in (98, 99, 100, 100, 101)]
    buf = PartitionBuffer(TP, serial=1, position=100)
    assert buf.take(run, 0, len(run), now=1.0, limits=limits) == (5, 2, 2 * HELD)
    split = buf.seal("age")
    assert [r.offset() for r in split.records] == [100, 101] and split.size_bytes == 2 * HELD


def test_take_stops_on_bytes_and_a_logical_start_takes_the_first_offset() -> None:
    run = [SyntheticRecord(o, b"abc") for o in (42, 43, 44)]
    each = held_bytes(run[0], TP.topic)
    limits = SplitLimits(max_records=100, max_bytes=2 * each - 1, max_age_s=60.0)
    buf = PartitionBuffer(TP, serial=1, position=None)
    assert buf.take(run, 0, len(run), now=1.0, limits=limits) == (2, 2, 2 * each)
    assert buf.full(limits) == "bytes"
    assert (buf.seal("bytes").start, buf.position) == (42, 44)


def test_seal_reasons() -> None:
    limits = SplitLimits(max_records=3, max_bytes=HELD + 100, max_age_s=5.0)
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


def test_the_byte_count_holds_keys_headers_and_each_record_object_not_only_values() -> None:
    """Real confluent-kafka messages, 10-byte values and 100-byte keys: what each one holds,
    measured here with sys.getsizeof, is what the buffer counts and what max_bytes bounds."""
    topic = "clicks-eu-west"
    tp = TopicPartition(topic, 0)
    records = [Message(topic=topic, partition=0, offset=o, key=b"k" * 100, value=b"v" * 10) for o in range(100)]
    one = records[0]
    # The message object, its value, key and topic name objects, and its slot in the buffer's list.
    held = sys.getsizeof(one) + sys.getsizeof(one.value()) + sys.getsizeof(one.key()) + sys.getsizeof(topic) + 8
    buf = PartitionBuffer(tp, serial=1, position=0)
    assert buf.take(records, 0, len(records), 0.0, UNBOUNDED) == (100, 100, 100 * held)
    assert buf.size_bytes == 100 * held  # not 100 * 10

    limits = SplitLimits(max_records=1000, max_bytes=10 * held, max_age_s=60.0)
    buf = PartitionBuffer(tp, serial=1, position=0)
    assert buf.take(records, 0, len(records), 0.0, limits) == (10, 10, 10 * held)
    assert buf.full(limits) == "bytes" and buf.seal("bytes").size_bytes == 10 * held


def test_headers_count_as_the_python_objects_they_become() -> None:
    topic = "clicks"
    headers = [("trace-id", b"t" * 16), ("tenant", None)]
    with_headers = Message(topic=topic, partition=0, offset=0, value=b"v" * 10, headers=headers)
    without = Message(topic=topic, partition=0, offset=0, value=b"v" * 10)
    # The list (its slots included), and per header its (name, value) tuple, the name and the value.
    expected = sys.getsizeof(headers) + sum(
        sys.getsizeof((name, data)) + sys.getsizeof(name) + (sys.getsizeof(data) if data is not None else 0)
        for name, data in headers
    )
    assert held_bytes(with_headers, topic) - held_bytes(without, topic) == expected


def test_take_counts_a_run_column_by_column_exactly_as_record_by_record() -> None:
    """Seeded random runs of real messages (keys or none, headers or none, offsets with holes,
    repeats and records from before the position), taken by ``take`` and by the record-by-record
    path it falls back to: the same records kept, bytes, positions and returned indexes."""
    rng = random.Random(29)
    topic = "clicks"
    tp = TopicPartition(topic, 0)
    for case in range(300):
        start = rng.randrange(5, 50)
        offset, records = start - rng.randrange(0, 3), []
        for _ in range(rng.randrange(1, 60)):
            offset = max(0, offset + (rng.choice((1, 1, 1, 2, 5, 0, -1)) if case % 3 == 0 else rng.choice((1, 1, 2))))
            key = rng.choice((None, b"", b"k" * rng.randrange(1, 40)))
            headers = rng.choice((None, [("h", b"x" * rng.randrange(0, 9)), ("g", None)]))
            value = rng.choice((None, b"v" * rng.randrange(0, 300)))
            records.append(Message(topic=topic, partition=0, offset=offset, key=key, value=value, headers=headers))
        limits = SplitLimits(max_records=rng.randrange(1, 80), max_bytes=rng.randrange(200, 40_000), max_age_s=60.0)
        position = rng.choice((None, start))
        fast, slow = PartitionBuffer(tp, 1, position), PartitionBuffer(tp, 1, position)
        i = j = 0
        steps = []
        while i < len(records):
            got = fast.take(records, i, len(records), float(i), limits)
            want = slow._take_each(records, j, len(records), float(j), limits)
            steps.append((got, want))
            assert got == want, (case, steps)
            i = j = got[0]
            if fast.full(limits):
                a, b = fast.seal("x", 0.0), slow.seal("x", 0.0)
                assert (a.start, a.end, a.records, a.size_bytes, a.first_record_at) == (
                    b.start,
                    b.end,
                    b.records,
                    b.size_bytes,
                    b.first_record_at,
                ), case
        assert (fast.position, fast.end, fast.size_bytes, len(fast)) == (
            slow.position,
            slow.end,
            slow.size_bytes,
            len(slow),
        )
