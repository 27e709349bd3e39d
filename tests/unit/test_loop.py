"""The consumer loop against the in-memory broker and metastore: what each reason to stop,
rewind, fence or reposition a partition does to what gets published."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from ingest.consume.assignment import PartitionState
from ingest.spec import SplitLimits
from ingest_common.model import DesiredState, TopicPartition, WorkerState
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


def test_records_are_published_in_order_exactly_once_and_drain_seals_the_rest(h: Harness) -> None:
    h.produce(P0, 25)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: len(h.published(P0)) == 2, what="two full splits")
    assert h.published(P0) == [(0, 10), (10, 20)]
    assert h.loop.drain()
    assert tiles(h.published(P0), 0, 25)
    assert h.store.next_offsets[P0] == 25


def test_a_revoke_kills_the_partitions_splits_and_a_kept_partition_loses_nothing(h: Harness) -> None:
    gate = threading.Event()
    h.builder.gates[0] = gate  # P0's and P1's first splits both start at 0: both wait
    h.produce(P0, 10)
    h.produce(P1, 10)
    h.consumer.group_assigns(P0, P1)
    h.step_until(lambda: h.pipeline.inflight_count == 2, what="both splits in flight")
    h.consumer.group_revokes(P0)
    h.loop.step()
    gate.set()
    h.step_until(lambda: h.published(P1) == [(0, 10)], what="P1's split")
    h.step_until(lambda: h.pipeline.inflight_count == 0, what="P0's split to end")
    assert h.published(P0) == []
    assert h.store.next_offsets[P0] == 0  # the start pinned at the claim, nothing published
    assert h.assignment.get(P0) is None and h.assignment.get(P1) is not None


def test_a_revoke_with_chunks_held_loses_nothing_after_the_partition_comes_back(h: Harness) -> None:
    """One poll's 25 records of a partition are one chunk: two splits are cut from it (held
    by the gated builds) and its last 5 records stay in the buffer as a slice of it. A revoke
    kills the splits and drops the buffer; assigned again, the partition is read from its
    stored offset and published exactly once, and the other partition's chunk is untouched."""
    gate = threading.Event()
    h.builder.gates[0] = gate
    h.produce(P0, 25)
    h.produce(P1, 25)
    h.consumer.group_assigns(P0, P1)

    def held(tp: TopicPartition) -> int:
        owned = h.assignment.get(tp)
        return 0 if owned is None else len(owned.buffer)

    h.step_until(lambda: held(P0) == 5, what="two splits cut from one chunk")
    assert h.pipeline.inflight_count == 4  # [0, 10) and [10, 20) of each partition
    h.consumer.group_revokes(P0)
    h.loop.step()
    assert h.assignment.get(P0) is None
    gate.set()
    h.step_until(lambda: h.pipeline.inflight_count == 0, what="P0's splits to end, P1's published")
    assert h.published(P0) == [] and h.store.next_offsets[P0] == 0
    h.consumer.group_assigns(P0)
    h.step_until(lambda: len(h.published(P0)) == 2, what="P0 read again from its stored offset")
    assert h.loop.drain()
    assert h.published(P0) == [(0, 10), (10, 20), (20, 25)]
    assert h.published(P1) == [(0, 10), (10, 20), (20, 25)]


def test_an_offset_conflict_rewinds_to_the_stored_offset(h: Harness) -> None:
    gate = threading.Event()
    h.builder.gates[0] = gate
    h.produce(P0, 20)
    h.consumer.group_assigns(P0)
    h.loop.step()  # assigned at the claim (nothing stored); the split [0, 10) waits at the gate
    with h.store.lock:
        h.store.next_offsets[P0] = 5  # the stored offset moved meanwhile
    gate.set()
    h.step_until(lambda: bool(h.published(P0)), timeout_s=8, what="a publish after the rewind")
    assert h.published(P0)[0][0] == 5
    assert (P0, 5) in h.consumer.seeks
    assert h.metrics.publish_conflicts.labels("src", "offset")._value.get() == 1


def test_a_serial_conflict_fences_the_partition_and_it_takes_nothing_more(h: Harness) -> None:
    h.produce(P0, 10)
    h.consumer.group_assigns(P0)
    h.loop.step()
    h.store.claim_partitions("src", "w2", [P0])  # another worker claimed it
    h.step_until(lambda: h.assignment.get(P0).state is PartitionState.FENCED, what="fenced")  # type: ignore[union-attr]
    h.produce(P0, 30)
    for _ in range(20):
        h.loop.step()
    assert h.published(P0) == [] and h.pipeline.inflight_count == 0
    assert P0 in h.consumer.paused()


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_offsets_gone_from_the_log_are_recorded_then_skipped_or_stopped(policy: str) -> None:
    h = Harness(spec=spec(on_offset_out_of_range=policy))
    try:
        h.produce(P0, 100)
        h.broker.delete_before(P0, 50)
        with h.store.lock:
            h.store.next_offsets[P0] = 0
        h.consumer.group_assigns(P0)
        h.step_until(lambda: bool(h.store.gaps), what="the gap recorded")
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


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_a_stored_offset_past_the_log_end_stops_the_partition_under_either_policy(policy: str) -> None:
    """An unclean leader election truncated the log below the stored offset: nothing is read
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
        assert len(h.assignment.get(P0).buffer) == 0  # type: ignore[union-attr]
    finally:
        h.close()


@pytest.mark.parametrize("policy", ["earliest", "fail"])
def test_a_log_truncated_below_the_stored_offset_is_detected_recorded_and_stops_the_partition(policy: str) -> None:
    """KIP-320: the log was truncated below the stored offset under a new leader epoch and grew
    past it again. The claim carries the stored leader epoch, the consumer validates it, and
    the partition stops under either policy: nothing read from 20 (which would skip the new
    records at [12, 20)), the lost range recorded with its reason, one error report."""
    h = Harness(spec=spec(on_offset_out_of_range=policy))
    try:
        h.produce(P0, 20)
        h.consumer.group_assigns(P0)
        h.step_until(lambda: h.published(P0) == [(0, 10), (10, 20)], what="20 published")
        assert h.store.leader_epochs[P0] == 0  # the epoch of the record at 19, stored with 20
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
        assert len(h.assignment.get(P0).buffer) == 0  # type: ignore[union-attr]
    finally:
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
    assert (P0, 3) in h.consumer.seeks


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
        assert len(h.assignment.get(P0).buffer) == 5  # type: ignore[union-attr]
    finally:
        h.store.hang.clear()
        h.store.released.set()


def test_suspend_seals_and_pauses_then_resume_continues_exactly_once(h: Harness) -> None:
    h.produce(P0, 14)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    h.store.set_control("src", DesiredState.SUSPENDED)
    h.step_until(lambda: h.loop.state is WorkerState.SUSPENDED, what="suspended")
    assert h.published(P0) == [(0, 10), (10, 14)] and P0 in h.consumer.paused()
    h.produce(P0, 6)
    for _ in range(10):
        h.loop.step()
    assert h.published(P0) == [(0, 10), (10, 14)]
    h.store.set_control("src", DesiredState.RUNNING)
    h.step_until(lambda: len(h.assignment.get(P0).buffer) == 6, what="the rest taken")  # type: ignore[union-attr]
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


def test_an_end_of_partition_in_the_same_poll_never_stretches_a_split_over_records_it_lacks(h: Harness) -> None:
    h.produce(P0, 5)
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.assignment.buffered_records() == 5, what="five records")
    h.produce(P0, 10)  # one poll: records 5..14, then the end of the partition at 15; splits of 10
    h.step_until(lambda: h.published(P0) == [(0, 10)], what="the first split")
    assert len(h.assignment.get(P0).buffer) == 5  # type: ignore[union-attr]
    assert h.loop.drain()
    assert h.published(P0) == [(0, 10), (10, 15)]
    with h.store.lock:
        rows = [item.segment.row_count for item in h.store.segments.values()]
    assert rows == [10, 5]


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


def test_a_polls_records_are_gathered_per_partition_in_their_order() -> None:
    """librdkafka hands out a partition's records together, but a batch may hold a partition in
    several runs (two fetches): each partition's records become one run, in the order consumed."""
    from ingest.consume.loop import partition_runs
    from ingest.splits.split import SyntheticRecord

    def rec(topic: str, partition: int, offset: int) -> SyntheticRecord:
        return SyntheticRecord(offset, topic=topic, partition=partition)

    batch = [rec("a", 0, 1), rec("a", 0, 2), rec("a", 1, 7), rec("a", 0, 3), rec("b", 0, 9), rec("a", 1, 8)]
    runs = [(t, p, [r.offset() for r in run]) for t, p, run in partition_runs(batch)]
    assert runs == [("a", 0, [1, 2, 3]), ("a", 1, [7, 8]), ("b", 0, [9])]
    one_topic = [rec("a", 2, 5), rec("a", 2, 6), rec("a", 0, 4)]
    assert [(t, p, len(run)) for t, p, run in partition_runs(one_topic)] == [("a", 2, 2), ("a", 0, 1)]
    assert partition_runs([]) == []
