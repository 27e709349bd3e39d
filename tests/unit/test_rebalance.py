"""The rebalance callbacks against the in-memory consumer and metastore."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.loop_harness import P0, P1, Harness


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def test_assign_claims_in_one_call_and_positions_at_the_stored_offsets(h: Harness) -> None:
    with h.store.lock:
        h.store.next_offsets[P1] = 40
    h.broker.produce(P0, b"{}")
    h.broker.produce(P1, *(b"{}" for _ in range(50)))
    h.handler.on_assign(h.consumer, [P0, P1])
    assert h.store.serials == {P0: 1, P1: 1} and h.store.owners == {P0: "w1", P1: "w1"}
    assert h.consumer.positions == {P0: 0, P1: 40}  # P0: nothing stored, the source starts at earliest
    assert {o.tp: o.cutter.position for o in h.assignment} == {P0: 0, P1: 40}
    assert h.store.next_offsets == {P0: 0, P1: 40}  # P0's start is stored under the claim


def test_a_claim_that_fails_past_the_deadline_assigns_nothing_and_stops_the_worker(h: Harness) -> None:
    h.store.unavailable_for = 10_000
    h.handler.on_assign(h.consumer, [P0])
    assert h.consumer.positions == {} and len(h.assignment) == 0
    assert h.handler.error is not None


def test_a_claim_retried_within_the_deadline_succeeds(h: Harness) -> None:
    h.store.unavailable_for = 2
    h.handler.on_assign(h.consumer, [P0])
    assert h.handler.error is None and h.assignment.get(P0) is not None


def test_revoke_releases_the_owner_and_lost_does_not_touch_the_metastore(h: Harness) -> None:
    h.handler.on_assign(h.consumer, [P0, P1])
    h.handler.on_revoke(h.consumer, [P0])
    assert h.store.owners[P0] is None and h.assignment.get(P0) is None and P0 not in h.consumer.positions
    h.store.unavailable_for = 10_000  # on_lost must not need the metastore
    h.handler.on_lost(h.consumer, [P1])
    assert h.store.owners[P1] == "w1" and len(h.assignment) == 0 and h.handler.error is None
