"""``start_from`` is resolved once per partition, at its first claim, and stored: every way a
partition is positioned again before its first publish (a failed first split, a re-assignment,
a suspend and resume) reads the stored start, so nothing produced after the first claim is
skipped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingest.consume.assignment import PartitionState
from ingest.spec.model import SplitLimits
from ingest_common.model import DesiredState, PartitionClaim, TopicPartition, WorkerState
from tests.loop_harness import P0, Harness, spec
from tests.unit.test_loop import tiles


def harness(max_records: int) -> Harness:
    return Harness(spec=spec(start_from="latest", split=SplitLimits(max_records=max_records, max_age_s=60.0)))


@pytest.fixture
def h() -> Iterator[Harness]:
    harness_ = harness(max_records=10)
    yield harness_
    harness_.close()


@pytest.fixture
def big() -> Iterator[Harness]:
    """Splits that only their age cuts (max_age: 60 s on the harness's clock)."""
    harness_ = harness(max_records=1000)
    yield harness_
    harness_.close()


def available(h: Harness) -> int:
    """Offsets of P0 in the log, not cut yet (-1: not owned)."""
    owned = h.assignment.get(P0)
    return owned.cutter.available() if owned is not None else -1


def assign_at_latest(h: Harness) -> None:
    h.produce(P0, 5)  # before the source reads: "latest" leaves these out
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.assignment.get(P0) is not None, what="the claim")
    assert h.store.next_offsets[P0] == 5  # the start, stored under the first claim


def test_a_failed_first_split_is_read_again_from_the_stored_start(h: Harness) -> None:
    assign_at_latest(h)
    h.builder.failures[5] = 1
    h.produce(P0, 20)
    h.step_until(lambda: sum(hi - lo for lo, hi in h.published(P0)) >= 20, timeout_s=10, what="offsets 5-24")
    assert tiles(h.published(P0), 5, 25)


def test_a_revoke_and_reassign_before_the_first_publish_keeps_the_start(big: Harness) -> None:
    assign_at_latest(big)
    big.produce(P0, 20)
    big.step_until(lambda: available(big) == 20, what="20 in the log")
    big.consumer.group_revokes(P0)
    big.loop.step()
    big.produce(P0, 10)
    big.consumer.group_assigns(P0)
    big.step_until(lambda: available(big) == 30, what="30 in the log, from the stored start")
    big.clock.advance(60)
    big.step_until(lambda: bool(big.published(P0)), what="the split, by age")
    assert big.loop.drain()
    assert tiles(big.published(P0), 5, 35)


def test_suspend_then_resume_before_the_first_publish_keeps_the_start(big: Harness) -> None:
    assign_at_latest(big)
    big.store.set_control("src", DesiredState.SUSPENDED)
    big.step_until(lambda: big.loop.state is WorkerState.SUSPENDED, what="suspended")
    big.produce(P0, 10)
    big.store.set_control("src", DesiredState.RUNNING)
    big.step_until(lambda: big.loop.state is WorkerState.RUNNING, what="resumed")
    big.step_until(lambda: available(big) == 10, what="10 in the log")
    big.clock.advance(60)
    big.step_until(lambda: bool(big.published(P0)), what="the split, by age")
    assert big.loop.drain()
    assert tiles(big.published(P0), 5, 15)


def test_a_claim_superseded_before_its_start_is_stored_is_fenced(h: Harness) -> None:
    real_pin = h.store.pin_start_offsets

    def claimed_meanwhile(source: str, pins: list[tuple[PartitionClaim, int]]) -> dict[TopicPartition, PartitionClaim]:
        h.store.claim_partitions(source, "w2", [c.tp for c, _ in pins])
        return real_pin(source, pins)

    h.store.pin_start_offsets = claimed_meanwhile  # type: ignore[method-assign]
    h.produce(P0, 5)
    h.consumer.group_assigns(P0)
    h.loop.step()
    owned = h.assignment.get(P0)
    assert owned is not None and owned.state is PartitionState.FENCED
    assert h.store.next_offsets[P0] is None  # w2 pins it when its own claim does
    h.produce(P0, 20)
    for _ in range(20):
        h.loop.step()
    assert h.published(P0) == [] and owned.cutter.available() == 0 and h.builder.started == []


def test_the_start_is_asked_of_the_log_once_even_when_the_claim_is_retried(h: Harness) -> None:
    h.store.unavailable_for = 1  # the claim's first try fails; the second claims and pins
    assign_at_latest(h)
    h.produce(P0, 10)
    h.consumer.group_revokes(P0)
    h.loop.step()
    h.consumer.group_assigns(P0)
    h.step_until(lambda: h.published(P0) == [(5, 15)], what="the split from the stored start")
