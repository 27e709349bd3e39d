"""The consumer loop against the in-memory broker and metastore: what each reason to stop,
rewind, fence or reposition a partition does to what gets published."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from ingest.consume.assignment import PartitionState
from ingest.spec.model import SplitLimits
from ingest_common.model import DesiredState, WorkerState
from tests.loop_harness import P0, P1, Harness, spec


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def tiles(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """The ranges, in publish order, cover [start, end) exactly once."""
    at = start
    for lo, hi in ranges:
        if lo != at:
            return False
        at = hi
    return at == end


def test_offsets_are_published_in_order_exactly_once_and_the_rest_by_age(h: Harness) -> None:
    h.produce(P0, 25)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: len(h.published(P0)) == 2, what="two full splits")
    assert h.published(P0) == [(0, 10), (10, 20)]
    assert h.assignment.get(P0).cutter.available() == 5  # type: ignore[union-attr]
    h.clock.advance(60)  # max_age
    h.step_until(lambda: len(h.published(P0)) == 3, what="the rest, by age")
    assert h.loop.drain()
    assert tiles(h.published(P0), 0, 25)
    assert h.store.next_offsets[P0] == 25
    with h.store.lock:
        assert [item.segment.row_count for item in h.store.segments.values()] == [10, 10, 5]


def test_a_revoke_kills_the_partitions_splits_and_a_kept_partition_loses_nothing(h: Harness) -> None:
    gate = threading.Event()
    h.builder.gates[0] = gate  # P0's and P1's first splits both start at 0: both wait
    h.produce(P0, 10)
    h.produce(P1, 10)
    h.consumer.group_assigns(P0, P1)
    h.step_until(lambda: h.publishes.inflight_count == 2, what="both splits in flight")
    h.consumer.group_revokes(P0)
    h.loop.step()
    gate.set()
    h.step_until(lambda: h.published(P1) == [(0, 10)], what="P1's split")
    h.step_until(lambda: h.publishes.inflight_count == 0, what="P0's split to end")
    assert h.published(P0) == []
    assert h.store.next_offsets[P0] == 0  # the start pinned at the claim, nothing published
    assert h.assignment.get(P0) is None and h.assignment.get(P1) is not None


def test_a_revoke_with_splits_in_flight_loses_nothing_after_the_partition_comes_back(h: Harness) -> None:
    """After each partition's first split, two more of each are in flight (held by the gated
    builds) and 5 offsets are not cut yet. A revoke kills P0's splits; assigned again, P0 is
    cut from its stored offset and published exactly once, and the other partition's splits
    are untouched."""
    h.produce(P0, 10)
    h.produce(P1, 10)
    h.consumer.group_assigns(P0, P1)
    h.step_until(lambda: h.published(P0) == h.published(P1) == [(0, 10)], what="each partition's first split")
    gate = threading.Event()
    h.builder.gates[10] = gate
    h.produce(P0, 25)
    h.produce(P1, 25)
    h.step_until(lambda: h.publishes.inflight_count == 4, what="[10, 20) and [20, 30) of each partition")
    h.consumer.group_revokes(P0)
    h.loop.step()
    assert h.assignment.get(P0) is None
    gate.set()
    h.step_until(lambda: h.publishes.inflight_count == 0, what="P0's splits to end, P1's published")
    assert h.published(P0) == [(0, 10)] and h.store.next_offsets[P0] == 10
    h.consumer.group_assigns(P0)
    h.step_until(lambda: len(h.published(P0)) == 3, what="P0 cut again from its stored offset")
    h.clock.advance(60)
    h.step_until(lambda: len(h.published(P0)) == 4 and len(h.published(P1)) == 4, what="the rest by age")
    assert h.published(P0) == [(0, 10), (10, 20), (20, 30), (30, 35)]
    assert h.published(P1) == [(0, 10), (10, 20), (20, 30), (30, 35)]


def test_an_offset_conflict_rewinds_to_the_stored_offset(h: Harness) -> None:
    gate = threading.Event()
    h.builder.gates[0] = gate
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.publishes.inflight_count == 1, what="[0, 10) at the gate")
    with h.store.lock:
        h.store.next_offsets[P0] = 5  # the stored offset moved meanwhile
    gate.set()
    h.step_until(lambda: bool(h.published(P0)), timeout_s=8, what="a publish after the rewind")
    assert h.published(P0)[0][0] == 5
    assert h.metrics.publish_conflicts.labels("src", "offset")._value.get() == 1


def test_a_serial_conflict_fences_the_partition_and_it_cuts_nothing_more(h: Harness) -> None:
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.loop.step()
    h.store.claim_partitions("src", "w2", [P0])  # another worker claimed it
    h.step_until(lambda: h.assignment.get(P0).state is PartitionState.FENCED, what="fenced")  # type: ignore[union-attr]
    h.produce(P0, 30)
    for _ in range(20):
        h.loop.step()
    assert h.published(P0) == [] and h.publishes.inflight_count == 0
    assert h.metrics.paused_partitions.labels("src")._value.get() == 1


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_offsets_gone_from_the_log_are_recorded_then_skipped_or_stopped(policy: str) -> None:
    """Found from the log-end query (its earliest offset is past the stored one) before any
    split is cut from the gone offsets."""
    h = Harness(spec=spec(on_offset_out_of_range=policy))
    try:
        h.produce(P0, 100)
        h.broker.delete_before(P0, 50)
        with h.store.lock:
            h.store.next_offsets[P0] = 0
        h.consumer.group_assigns(P0)
        h.step_until(lambda: bool(h.store.gaps), what="the gap recorded")
        assert h.builder.started == []  # no split of the gone offsets was built
        if policy == "earliest":
            h.step_until(lambda: len(h.published(P0)) == 5, what="the rest published")
            assert h.store.gaps == [(P0, 0, 50, True)]
            assert tiles(h.published(P0), 50, 100)
        else:
            for _ in range(20):
                h.loop.step()
            assert h.store.gaps == [(P0, 0, 50, False)]
            assert h.published(P0) == [] and h.store.next_offsets[P0] == 0
            assert h.assignment.get(P0).state is PartitionState.OUT_OF_RANGE  # type: ignore[union-attr]
            h.step_until(lambda: bool(h.store.errors), what="the error report")
            assert [kind for kind, _ in h.store.errors] == ["OFFSET_OUT_OF_RANGE"]
    finally:
        h.close()


def test_offsets_gone_under_a_split_in_flight_fail_its_build_and_the_gap_is_recorded() -> None:
    """Retention between the cut and Spark's read: the read fails (failOnDataLoss), never a
    split published with fewer records; the next log-end answer stops the partition and the
    gap is measured against the stored offset."""
    h = Harness(spec=spec(on_offset_out_of_range="fail"))
    gate = threading.Event()
    h.builder.gates[0] = gate
    try:
        h.produce(P0, 10)
        h.consumer.group_assigns(P0)
        h.step_until(lambda: h.publishes.inflight_count == 1, what="[0, 10) at the gate")
        h.broker.delete_before(P0, 5)
        gate.set()
        h.step_until(lambda: bool(h.store.gaps), what="the gap recorded")
        assert h.published(P0) == [] and h.store.gaps == [(P0, 0, 5, False)]
    finally:
        h.close()


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_a_stored_offset_past_the_log_end_stops_the_partition_under_either_policy(policy: str) -> None:
    """An unclean leader election truncated the log below the stored offset: nothing is cut
    from the log end or anywhere else, nothing is skipped or recorded as skipped, and the
    error says so (``ingest status`` shows the partition OFFSET_OUT_OF_RANGE)."""
    h = Harness(spec=spec(on_offset_out_of_range=policy))
    try:
        h.produce(P0, 10)
        with h.store.lock:
            h.store.next_offsets[P0] = 50
        h.consumer.group_assigns(P0)
        h.step_until(lambda: bool(h.store.errors), what="the error report")
        assert [kind for kind, _ in h.store.errors] == ["OFFSET_OUT_OF_RANGE"]
        assert "stored offset 50 is past the log end 10" in h.store.errors[0][1]
        assert h.assignment.get(P0).state is PartitionState.OUT_OF_RANGE  # type: ignore[union-attr]
        h.produce(P0, 60)  # the log grows past the stored offset: the partition stays stopped
        for _ in range(20):
            h.loop.step()
        assert h.published(P0) == [] and h.store.gaps == [] and h.store.next_offsets[P0] == 50
        assert h.builder.started == []
    finally:
        h.close()


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_a_log_truncated_below_the_stored_offset_is_detected_recorded_and_stops_the_partition(policy: str) -> None:
    """KIP-320: the log was truncated below the stored offset under a new leader epoch and grew
    past it again. The claim carries the stored leader epoch, the member validates it, and
    the partition stops under either policy: nothing cut from 20 (which would skip the new
    records at [12, 20)), the lost range recorded with its reason, one error report."""
    h = Harness(spec=spec(on_offset_out_of_range=policy))
    try:
        h.produce(P0, 20)
        h.consumer.group_assigns(P0)
        h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
        assert h.store.leader_epochs[P0] == 0  # the epoch 20 was known stable under, stored with it
        h.consumer.group_revokes(P0)
        h.step_until(lambda: h.assignment.get(P0) is None, what="revoked")
        h.broker.truncate(P0, 12)
        h.produce(P0, 30)  # epoch 1, the log ends at 42 now
        h.consumer.group_assigns(P0)
        h.step_until(lambda: bool(h.store.errors), what="the error report")
        assert [kind for kind, _ in h.store.errors] == ["LOG_TRUNCATED"]
        assert "offsets [12, 20)" in h.store.errors[0][1]
        assert h.store.truncations == [(P0, 12, 20)] and h.store.gaps == []
        for _ in range(20):
            h.loop.step()
        assert h.published(P0) == [(0, 10), (10, 20)] and h.store.next_offsets[P0] == 20
        assert h.assignment.get(P0).state is PartitionState.OUT_OF_RANGE  # type: ignore[union-attr]
    finally:
        h.close()


def test_a_log_truncated_below_what_was_cut_is_found_while_the_worker_runs() -> None:
    """A log-end answer under a new leader epoch makes the partition validate its position
    under the epoch it was cut under before anything more is cut: a truncation below offsets
    already published is found without a rebalance, even once the new leader's log grew past
    the position, and the partition stops."""
    h = Harness(spec=spec(on_offset_out_of_range="earliest"))
    try:
        h.produce(P0, 20)
        h.consumer.group_assigns(P0)
        h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
        h.broker.truncate(P0, 12)
        h.produce(P0, 30)  # epoch 1: the log ends at 42, past the position
        h.step_until(lambda: bool(h.store.truncations), what="the truncation recorded")
        assert h.store.truncations == [(P0, 12, 20)]
        assert (P0, 20, 0) in h.validator.asked
        for _ in range(20):
            h.loop.step()
        assert h.published(P0) == [(0, 10), (10, 20)]
    finally:
        h.close()


def test_a_new_leader_epoch_without_truncation_is_validated_and_cutting_goes_on(h: Harness) -> None:
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    h.validator.held.add(P0)  # the broker has not answered the validation yet
    h.broker.epochs[P0] = 2  # a clean leader change: the log is kept
    h.produce(P0, 10)
    for _ in range(20):
        h.loop.step()
    assert h.published(P0) == [(0, 10)]  # nothing cut before the answer
    assert h.validator.asked[-1] == (P0, 10, 0)
    h.validator.held.clear()
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="cut again once valid")
    assert h.store.leader_epochs[P0] == 2 and h.store.truncations == []


def test_a_truncation_found_while_a_publish_holds_a_split_ending_on_a_marker_never_resumes_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kill switch gives up while a publish holds it (the metastore hangs), the log is
    truncated, and the split being published ends on a transaction marker (no record at its
    last offset). The late publish commits after the gap was measured against the older stored
    offset; the stored position it leaves carries the leader epoch of its cut, so the rewind to
    it is validated and the truncation below it is found: the partition stops, the published
    offsets the new log no longer holds are recorded, nothing past them is published."""
    import ingest.publish.queue as publish_queue

    monkeypatch.setattr(publish_queue, "KILL_WAIT_S", 0.2)
    h = Harness(spec=spec(on_offset_out_of_range="earliest", split=SplitLimits(max_records=14, max_age_s=60.0)))
    try:
        h.produce(P0, 10)
        h.broker.begin_transaction(P0, b'{"ts": 1}', b'{"ts": 1}', b'{"ts": 1}')
        h.broker.end_transaction(P0, commit=False)  # [10, 13) aborted, the marker at 13
        h.consumer.group_assigns(P0)
        h.store.publish_open.clear()  # the publish of [0, 14) will hang, holding the switch
        h.step_until(lambda: h.publishes.publishing is not None, what="the publish under way")
        h.broker.truncate(P0, 12)  # below the split's end: [12, 14) gone, epoch 1
        h.produce(P0, 20)
        # The new leader epoch: the position 14 is validated under epoch 0 and found truncated;
        # the kill of the split being published gives up after KILL_WAIT_S.
        h.step_until(lambda: h.assignment.get(P0).state is not PartitionState.ACTIVE, what="stopped")  # type: ignore[union-attr]
        # Measured against the stored offset before the late publish commits: the truncation is
        # above it, only splits in flight seemed touched: a rewind, no record.
        h.step_until(
            lambda: h.assignment.get(P0).state is PartitionState.REWINDING,  # type: ignore[union-attr]
            what="the rewind after the measurement",
        )
        assert h.store.truncations == [] and h.store.next_offsets[P0] == 0
        h.store.publish_open.set()  # the late publish commits: next_offset 14
        h.step_until(lambda: bool(h.store.truncations), timeout_s=10, what="the truncation recorded")
        for _ in range(30):
            h.loop.step()
        assert h.store.truncations == [(P0, 12, 14)]
        assert h.published(P0) == [(0, 14)] and h.store.next_offsets[P0] == 14
        assert h.assignment.get(P0).state is PartitionState.OUT_OF_RANGE  # type: ignore[union-attr]
    finally:
        h.store.publish_open.set()
        h.close()


def test_a_new_leader_epoch_without_truncation_resumes_at_the_stored_offset(h: Harness) -> None:
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
    h.consumer.group_revokes(P0)
    h.step_until(lambda: h.assignment.get(P0) is None, what="revoked")
    h.broker.epochs[P0] = 3  # a clean leader change: the log is kept
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: len(h.published(P0)) == 3, what="the rest published")
    assert h.published(P0)[2] == (20, 30) and h.store.errors == [] and h.store.truncations == []
    assert h.store.leader_epochs[P0] == 3


def test_a_reset_reclaims_and_repositions_at_the_reset_offset(h: Harness) -> None:
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
    h.store.reset(P0, 3)
    h.produce(P0, 7)
    h.step_until(lambda: len(h.published(P0)) >= 3, what="the replay from 3")
    assert h.published(P0)[2] == (3, 13)


def test_the_loop_keeps_polling_while_the_metastore_hangs(h: Harness) -> None:
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.registry.control is not None, what="the first heartbeat")
    h.store.hang.set()
    h.store.released.clear()
    try:
        h.produce(P0, 5)
        started = time.monotonic()
        steps = 0
        while time.monotonic() - started < 0.5:
            h.loop.step()
            steps += 1
        # Heartbeats are due at every step (interval 0), yet none blocks: the loop polled on.
        assert steps > 20
        assert h.assignment.get(P0).cutter.available() == 5  # type: ignore[union-attr]
    finally:
        h.store.hang.clear()
        h.store.released.set()


def test_suspend_publishes_what_is_in_the_log_cuts_nothing_more_then_resume_continues_exactly_once(
    h: Harness,
) -> None:
    h.produce(P0, 14)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    h.store.set_control("src", DesiredState.SUSPENDED)
    h.step_until(lambda: h.loop.state is WorkerState.SUSPENDED, what="suspended")
    assert h.published(P0) == [(0, 10), (10, 14)]  # what was in the log when the hold began
    h.produce(P0, 6)
    h.clock.advance(60)  # even past max_age: nothing is cut while suspended
    for _ in range(10):
        h.loop.step()
    assert h.published(P0) == [(0, 10), (10, 14)]
    assert h.metrics.paused_partitions.labels("src")._value.get() == 1
    h.store.set_control("src", DesiredState.RUNNING)
    h.clock.advance(60)
    h.step_until(lambda: len(h.published(P0)) == 3, what="the rest cut")
    assert h.loop.state is WorkerState.RUNNING and h.loop.drain()
    assert tiles(h.published(P0), 0, 20)


def test_failing_splits_make_the_worker_unhealthy_and_a_publish_heals_it(h: Harness) -> None:
    h.builder.failures[0] = 5
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.loop.unhealthy_reason is not None, what="unhealthy")
    assert h.loop.state is WorkerState.UNHEALTHY
    assert "5 splits failed in a row" in (h.loop.unhealthy_reason or "")
    h.step_until(lambda: h.loop.unhealthy_reason is None, what="the publish after the failures")
    assert h.published(P0) == [(0, 10)]
    assert h.metrics.split_failures.labels("src", "build")._value.get() == 5


def test_transactions_decided_are_cut_over_and_an_open_one_is_waited_for(h: Harness) -> None:
    """Splits end at the last stable offset: an aborted transaction's records and every
    marker lie inside ranges (their records are never read), and nothing is cut past the
    first offset of a transaction still open until it is decided."""
    h.produce(P0, 4)
    h.broker.begin_transaction(P0, b'{"ts": 1}', b'{"ts": 1}')
    h.broker.end_transaction(P0, commit=False)  # [4, 6) aborted, marker at 6
    h.broker.begin_transaction(P0, b'{"ts": 1}', b'{"ts": 1}', b'{"ts": 1}')  # open from 7
    h.consumer.group_assigns(P0)
    h.clock.advance(60)
    h.step_until(lambda: h.published(P0) == [(0, 7)], what="up to the open transaction")
    for _ in range(10):
        h.loop.step()
    assert h.published(P0) == [(0, 7)]
    h.broker.end_transaction(P0, commit=True)  # [7, 10) committed, marker at 10
    h.clock.advance(60)
    h.step_until(lambda: h.published(P0) == [(0, 7), (7, 11)], what="the decided transaction")
    assert h.store.next_offsets[P0] == 11
    with h.store.lock:
        assert [item.segment.row_count for item in h.store.segments.values()] == [4, 3]


def test_a_backlog_is_cut_in_full_splits_within_the_in_flight_bound_one_partition_after_another() -> None:
    h = Harness(spec=spec(split=SplitLimits(max_records=10, max_age_s=60.0, max_in_flight=3)))
    gate = threading.Event()
    for start in (10, 20, 30):  # after each partition's first split, which teaches its size
        h.builder.gates[start] = gate
    try:
        h.produce(P0, 100)
        h.produce(P1, 100)
        h.consumer.group_assigns(P0, P1)
        h.step_until(lambda: h.publishes.inflight_count == 3, what="three splits in flight")
        for _ in range(10):
            h.loop.step()
        assert h.publishes.inflight_count == 3
        assert h.publishes.inflight_partitions() == {P0, P1}  # both partitions got a place
        gate.set()
        h.step_until(lambda: len(h.published(P0)) == 10 and len(h.published(P1)) == 10, what="every split")
        assert tiles(h.published(P0), 0, 100) and tiles(h.published(P1), 0, 100)
    finally:
        gate.set()
        h.close()


def test_a_failed_log_end_answer_keeps_what_the_partition_had(h: Harness) -> None:
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    h.offsets.failing.add(P0)
    h.produce(P0, 10)
    for _ in range(10):
        h.loop.step()
    assert h.published(P0) == [(0, 10)] and h.metrics.kafka_errors.labels("src")._value.get() > 0
    h.offsets.failing.clear()
    h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="the next split")


def test_bytes_per_offset_are_learned_from_the_first_split_and_then_cut_by_max_bytes() -> None:
    """Until a partition's first split is built, its bytes per offset are a guess
    (INITIAL_BYTES_PER_OFFSET, 512): one split is cut on it and nothing more of the partition
    until its build said how many bytes its offsets held; from then on a split is cut where
    the estimate reaches max_bytes."""
    h = Harness(spec=spec(split=SplitLimits(max_records=100, max_bytes=1000, max_age_s=60.0)))
    gate = threading.Event()
    h.builder.gates[0] = gate
    try:
        h.broker.produce(P0, *(b"x" * 99 for _ in range(30)), key=b"k")  # 100 bytes an offset
        h.consumer.group_assigns(P0)
        h.step_until(lambda: h.publishes.inflight_count == 1, what="the first split")
        for _ in range(10):
            h.loop.step()
        assert h.publishes.inflight_count == 1  # the guess is not trusted for more
        gate.set()
        h.step_until(lambda: len(h.published(P0)) == 3, what="the splits cut by the learned size")
        assert h.published(P0)[:3] == [(0, 1), (1, 11), (11, 21)]  # 1000 bytes: 1 offset at 512, 10 at 100
        assert h.assignment.get(P0).size.per_offset == 100  # type: ignore[union-attr]
    finally:
        gate.set()
        h.close()


def test_a_new_spec_version_applies_from_the_next_split_on_and_is_reported(h: Harness) -> None:
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    newer = dataclasses.replace(h.spec, split=SplitLimits(max_records=5, max_age_s=60.0))
    with h.store.lock:
        h.store.spec, h.store.spec_version = newer.to_json(), 2
        c = h.store.control_state
        h.store.control_state = dataclasses.replace(c, spec_version=2)
    h.step_until(lambda: h.store.reported_spec_versions[-1:] == [2], what="the new version reported")
    h.produce(P0, 10)
    h.step_until(lambda: len(h.published(P0)) == 3, what="two splits of the new limit")
    assert h.published(P0) == [(0, 10), (10, 15), (15, 20)]
    with h.store.lock:
        versions = [item.spec_version for item in h.store.segments.values()]
    assert versions == [1, 2, 2]
