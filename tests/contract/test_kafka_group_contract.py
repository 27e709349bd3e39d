"""The consumer group side of the group member (ingest.consume.kafka.Consumer), run against the
in-memory member and a real broker: the rebalance callbacks (assign, revoke, lost) the handler
relies on (when and where they run, what they list under cooperative and eager assignment) and
the commits of published offsets. What the unit tests drive by hand with ``group_assigns`` and
``group_rebalances`` is what a broker does."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from ingest.consume.kafka import Batch, Consumer
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.contract.conftest import Backend
from tests.memory_kafka import MemoryConsumer

ASSIGNMENTS = pytest.mark.parametrize("incremental", [True, False], ids=["cooperative", "eager"])


@dataclass
class Listener:
    """Assigns what the group gives at ``starts``, unassigns what it takes; records each call
    as (kind, partitions) and where it ran."""

    consumer: Consumer
    starts: dict[TopicPartition, int]
    calls: list[tuple[str, list[TopicPartition]]] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    polling: bool = False

    def _seen(self, kind: str, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            self.misplaced.append(f"{kind}: called with {consumer!r}, not the boundary")
        if not self.polling or threading.current_thread() is not threading.main_thread():
            self.misplaced.append(f"{kind}: outside poll or off the polling thread")
        if not all(isinstance(tp, TopicPartition) for tp in tps):
            self.misplaced.append(f"{kind}: {tps!r} are not the project's TopicPartitions")
        self.calls.append((kind, sorted(tps)))

    def on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        self._seen("assign", consumer, tps)
        consumer.assign({tp: self.starts[tp] for tp in tps})

    def on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        self._seen("revoke", consumer, tps)
        consumer.unassign(tps)

    def on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        self._seen("lost", consumer, tps)
        consumer.unassign(tps)

    def poll(self) -> Batch:
        self.polling = True
        try:
            return self.consumer.poll(0.1)
        finally:
            self.polling = False


def joined(backend: Backend, incremental: bool, starts: dict[TopicPartition, int]) -> Listener:
    """A member subscribed to the backend's topic (alone in its group so far)."""
    consumer = backend.make_consumer(incremental)
    listener = Listener(consumer, starts)
    consumer.subscribe([backend.tp.topic], listener)
    if isinstance(consumer, MemoryConsumer):
        consumer.group_assigns(backend.tp, backend.other)  # what the broker does for a lone member
    return listener


@ASSIGNMENTS
def test_a_lone_member_is_assigned_every_partition_inside_poll_and_reads_nothing(
    backend: Backend, incremental: bool
) -> None:
    backend.produce_to(backend.tp, 10)
    backend.produce_to(backend.other, 10)
    listener = joined(backend, incremental, {backend.tp: 3, backend.other: 5})
    dropped = 0

    def assigned() -> bool:
        nonlocal dropped
        dropped += listener.poll().records_dropped
        return bool(listener.calls)

    wait_until(assigned, 60, "the assignment", interval=0, detail=lambda: f"{listener.calls}")
    for _ in range(10):
        dropped += listener.poll().records_dropped
    assert listener.calls == [("assign", [backend.tp, backend.other])]
    assert listener.misplaced == []
    assert dropped == 0  # paused from the assignment on: Spark reads the records


@ASSIGNMENTS
def test_when_a_member_joins_cooperative_revokes_only_what_moves_and_eager_revokes_everything(
    backend: Backend, incremental: bool
) -> None:
    backend.produce_to(backend.tp, 4)
    backend.produce_to(backend.other, 4)
    listener = joined(backend, incremental, {backend.tp: 0, backend.other: 0})
    wait_until(lambda: listener.poll() and listener.calls, 60, "the first assignment", interval=0)
    listener.starts = {backend.tp: 4, backend.other: 4}  # where an eager re-assign starts
    step, held_by_new = backend.second_member(listener.consumer, incremental)

    def moved() -> bool:
        listener.poll()
        step()
        return bool(held_by_new()) and any(kind == "revoke" for kind, _ in listener.calls)

    wait_until(moved, 90, "the rebalance", interval=0, detail=lambda: f"{listener.calls}, new member {held_by_new()}")
    # The rebalance's last call (cooperative: an empty assign; eager: the new assignment)
    # comes in a later poll.
    wait_until(lambda: listener.poll() and len(listener.calls) >= 3, 60, "the rebalance's end", interval=0)
    given = held_by_new()
    kept = sorted({backend.tp, backend.other} - given)
    assert len(given) == 1 and len(kept) == 1
    both = [backend.tp, backend.other]
    if incremental:
        # librdkafka may repeat the empty assign; each adds nothing.
        assert listener.calls[:3] == [("assign", both), ("revoke", sorted(given)), ("assign", [])]
        assert set(map(str, listener.calls[3:])) <= {str(("assign", []))}, listener.calls
    else:
        assert listener.calls == [("assign", both), ("revoke", both), ("assign", kept)]
    assert listener.misplaced == []


def test_a_commit_stores_each_partitions_offset_for_the_group_and_the_last_one_wins(backend: Backend) -> None:
    backend.produce_to(backend.tp, 10)
    consumer = backend.consumer
    consumer.assign({backend.tp: 0, backend.other: 0})
    consumer.commit({backend.tp: 7, backend.other: 3})
    consumer.commit({backend.tp: 9})

    def stored() -> dict[TopicPartition, int] | None:
        consumer.poll(0.05)  # the commits' callbacks are served inside poll
        found = backend.committed()
        return found if found == {backend.tp: 9, backend.other: 3} else None

    wait_until(stored, 30, "the committed offsets", interval=0.1, detail=lambda: f"{backend.committed()}")


@ASSIGNMENTS
def test_a_member_that_stops_polling_past_the_interval_loses_its_partitions_then_gets_them_back(
    backend: Backend, incremental: bool
) -> None:
    listener = joined(backend, incremental, {backend.tp: 0, backend.other: 0})
    wait_until(lambda: listener.poll() and listener.calls, 60, "the first assignment", interval=0)
    backend.stall(listener.consumer)
    both = [backend.tp, backend.other]
    wait_until(lambda: listener.poll() and len(listener.calls) >= 3, 60, "the loss and the new assignment", interval=0)
    assert listener.calls[:3] == [("assign", both), ("lost", both), ("assign", both)]
    assert listener.misplaced == []
