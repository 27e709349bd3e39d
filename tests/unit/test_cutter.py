"""Splits cut from offsets (ingest.consume.cutter) and their kill switches
(ingest.splits.kill_switch), on their own: what is due when, where a cut ends, how long the
offsets left have waited, what the partition's bytes per offset become, what needs the
broker's validation first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.consume.cutter import INITIAL_BYTES_PER_OFFSET, OffsetSize, PartitionCutter
from ingest.consume.log_offsets import LogEnd
from ingest.errors import SplitKilled
from ingest.spec.model import SplitLimits
from ingest.splits.kill_switch import KillSwitch
from ingest_common.model import TopicPartition

TP = TopicPartition("t", 0)
LIMITS = SplitLimits(max_records=100, max_bytes=10_000, max_age_s=5.0)


def end(stable: int, epoch: int | None = 0, earliest: int = 0) -> LogEnd:
    return LogEnd(stable, epoch, earliest)


def learned(per_offset: float) -> OffsetSize:
    size = OffsetSize()
    size.update(int(per_offset * 1000), 1000)
    return size


def test_a_split_is_due_by_records_by_estimated_bytes_or_by_age() -> None:
    size = learned(10)
    cutter = PartitionCutter(TP, 1, 0)
    cutter.log_end(end(50), now=0.0)
    assert cutter.due(LIMITS, size, now=4.9) is None
    assert cutter.due(LIMITS, size, now=5.0) == "age"
    cutter.log_end(end(100), now=1.0)
    assert cutter.due(LIMITS, size, now=1.0) == "records"
    assert cutter.due(LIMITS, learned(200), now=1.0) == "records"
    cutter.log_end(end(99), now=1.0)  # a lower answer is ignored (a stale one)
    assert cutter.stable == 100
    small = PartitionCutter(TP, 1, 0)
    small.log_end(end(60), now=0.0)
    assert small.due(LIMITS, learned(200), now=0.0) == "bytes"  # 60 x 200 >= 10,000


def test_a_cut_takes_at_most_max_records_and_what_fits_max_bytes_and_tiles_the_offsets() -> None:
    cutter = PartitionCutter(TP, 1, 10)
    cutter.log_end(end(500, epoch=3), now=0.0)
    size = learned(400)  # 25 offsets fit 10,000 bytes
    first = cutter.cut("bytes", LIMITS, size, now=0.0)
    second = cutter.cut("bytes", LIMITS, size, now=0.0)
    assert (first.start, first.end, second.start, second.end) == (10, 35, 35, 60)
    assert first.estimated_bytes == 10_000 and first.leader_epoch == 3
    records = cutter.cut("records", LIMITS, learned(1), now=0.0)
    assert (records.start, records.end) == (60, 160)
    rest = cutter.cut("age", SplitLimits(max_records=1000, max_bytes=10**9), learned(1), now=0.0)
    assert (rest.start, rest.end) == (160, 500) and cutter.available() == 0


def test_offsets_are_dated_by_the_answer_before_the_one_that_first_held_them() -> None:
    """They were written after the previous answer was given: dating them by the first answer
    that holds them would let a split wait ``max_age`` plus the query interval."""
    cutter = PartitionCutter(TP, 1, 0)
    cutter.log_end(end(0), now=0.5)  # nothing past the position yet
    cutter.log_end(end(30), now=1.0)
    cutter.log_end(end(80), now=2.0)
    cutter.log_end(end(80), now=2.5)  # nothing new
    cutter.log_end(end(120), now=3.0)
    assert cutter.available_since() == 0.5  # [0, 30) was written after the answer of 0.5
    assert cutter.due(SplitLimits(max_age_s=5.0), learned(1), now=5.5) == "age"
    cutter.cut("records", SplitLimits(max_records=50), learned(1), now=3.5)  # [0, 50)
    assert cutter.available_since() == 1.0  # [50, 80): after the answer of 1.0
    cutter.cut("records", SplitLimits(max_records=30), learned(1), now=3.5)  # [50, 80)
    assert cutter.available_since() == 2.5
    cutter.cut("age", SplitLimits(max_records=100), learned(1), now=3.5)
    assert cutter.available_since() is None and cutter.available() == 0
    first = PartitionCutter(TP, 1, 0)
    first.log_end(end(10), now=7.0)  # no answer before it: dated by itself
    assert first.available_since() == 7.0


def test_bytes_per_offset_start_as_a_guess_and_follow_what_builds_read() -> None:
    size = OffsetSize()
    assert not size.learned and size.per_offset == INITIAL_BYTES_PER_OFFSET
    size.update(1000, 10)
    assert size.learned and size.per_offset == 100
    size.update(3000, 10)
    assert size.per_offset == 200  # each new split weighs half
    size.update(0, 0)  # a split of no offsets says nothing
    assert size.per_offset == 200
    assert size.offsets_within(1000) == 5 and size.offsets_within(10) == 1


def test_a_position_known_under_a_leader_epoch_is_validated_before_anything_is_cut() -> None:
    cutter = PartitionCutter(TP, 1, 20, position_epoch=2)
    cutter.log_end(end(100, epoch=2), now=0.0)
    assert cutter.needs_validation() and cutter.due(LIMITS, learned(1), now=10.0) is None
    assert cutter.validation_asked() == (20, 2)
    assert not cutter.needs_validation()  # asked once, until its answer
    cutter.validation_passed()
    assert cutter.due(LIMITS, learned(1), now=10.0) == "age"  # 80 offsets, waited 10 s


def test_a_new_leader_epoch_makes_the_position_validated_again_under_its_own() -> None:
    cutter = PartitionCutter(TP, 1, 0)
    cutter.log_end(end(100, epoch=2), now=0.0)
    cutter.cut("records", LIMITS, learned(1), now=0.0)
    assert cutter.position_epoch == 2 and cutter.validated
    cutter.log_end(end(150, epoch=3), now=1.0)
    assert cutter.needs_validation() and cutter.due(LIMITS, learned(1), now=10.0) is None
    assert cutter.validation_asked() == (100, 2)  # the epoch the position was cut under
    cutter.validation_passed()
    assert cutter.position_epoch == 3 and cutter.due(LIMITS, learned(1), now=10.0) == "age"


def test_a_log_end_below_the_position_is_not_taken() -> None:
    cutter = PartitionCutter(TP, 1, 50)
    assert cutter.behind_position(end(40))
    cutter.log_end(end(40), now=0.0)
    assert cutter.stable is None and cutter.available() == 0


@given(answers=st.lists(st.integers(0, 40), min_size=1, max_size=30), cuts=st.lists(st.integers(1, 30), max_size=30))
def test_cuts_tile_the_offsets_and_never_pass_the_last_stable_offset(answers: list[int], cuts: list[int]) -> None:
    cutter = PartitionCutter(TP, 1, 0)
    stable = 0
    at = 0
    for i, step in enumerate(answers):
        stable += step
        cutter.log_end(end(stable), now=float(i))
        if i < len(cuts) and cutter.available():
            split = cutter.cut("records", SplitLimits(max_records=cuts[i]), learned(1), now=float(i))
            assert split.start == at and at < split.end <= stable
            at = split.end
    assert cutter.position == at and cutter.available() == stable - at


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
