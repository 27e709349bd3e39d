"""The publish stage's queue: every split in flight, from its cut until its outcome, with the
future its build returns (ingest.builder.queue); one thread publishes them strictly in offset
order per partition and hands each outcome to the polling thread (``poll``).

Invariants:
- For each partition, splits are published strictly in the order they were submitted; a split
  is never published while an earlier split of its partition is unresolved.
- When a split of a partition fails or is refused, every later split of that partition still in
  flight is killed (they could only be refused: the stored offset did not move).
- Files of a split are deleted only when it is certain they were not published and never will
  be (ingest.publish.settle).
- Consumer calls never happen here: outcomes go back to the polling thread via ``poll()``.
- This queue holds every split in flight, so killing the splits of some partitions
  (``kill``) reaches each of them, whatever stage it is in: its build is skipped or interrupted,
  its publish refused by the switch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import structlog

from ingest.publish.publisher import Publisher
from ingest.publish.settle import Discard, Killed, Outcome, Published, PublishInProgress, Settler
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, KillReason, TopicPartition

log = structlog.get_logger(__name__)

# How long tripping one split's switch waits for a commit of it in progress, unless the caller
# gives all of them a bound (a rebalance callback's deadline).
KILL_WAIT_S = 5.0


@dataclass(slots=True)
class _Entry:
    split: SealedSplit
    built: Future[BuiltSegment]
    # The spec version the split is built and published with.
    spec_version: int


class PublishQueue:
    def __init__(self, publisher: Publisher, *, discard: Discard | None = None, publish_delay_s: float = 0.0) -> None:
        self._settler = Settler(publisher, discard=discard, publish_delay_s=publish_delay_s)
        self._cond = threading.Condition()
        self._queues: dict[TopicPartition, deque[_Entry]] = {}
        self._outcomes: list[Outcome] = []
        self._inflight_bytes = 0
        self._inflight_count = 0
        self._closing = False
        self._thread = threading.Thread(target=self._publish_loop, name="ingest-publish", daemon=True)
        self._thread.start()

    # -- polling thread API ------------------------------------------------------------

    def submit(self, split: SealedSplit, built: Future[BuiltSegment], spec_version: int) -> None:
        """Publish ``split`` once ``built`` resolves, after every earlier split of its partition."""
        with self._cond:
            self._queues.setdefault(split.tp, deque()).append(_Entry(split, built, spec_version))
            self._inflight_count += 1
            self._inflight_bytes += split.estimated_bytes
            self._cond.notify_all()
        built.add_done_callback(self._wake)

    def kill(self, tps: Iterable[TopicPartition], reason: KillReason, within_s: float | None = None) -> int:
        """Trip the kill switch of every in-flight split of these partitions. When this
        returns, none of them can start a commit (unless a commit in progress outlived
        ``within_s``, the time all of them may take; the metastore's serial check still fences it)."""
        wanted = set(tps)
        with self._cond:
            splits = [e.split for tp, q in self._queues.items() if tp in wanted for e in q]
        return trip(splits, reason, within_s)

    def kill_all(self, reason: KillReason, within_s: float | None = None) -> int:
        with self._cond:
            splits = [e.split for q in self._queues.values() for e in q]
        return trip(splits, reason, within_s)

    def poll(self) -> list[Outcome]:
        with self._cond:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    @property
    def publishing(self) -> PublishInProgress | None:
        """The split being published now, since when (read by ingest.consume.publish_watch)."""
        return self._settler.publishing

    @property
    def inflight_count(self) -> int:
        return self._inflight_count

    @property
    def inflight_bytes(self) -> int:
        """The estimated bytes of every split in flight (ingest.consume.cutter)."""
        return self._inflight_bytes

    def oldest_available_at(self, tp: TopicPartition) -> float | None:
        """When the first offset of the oldest unresolved split of ``tp`` was first seen in the log."""
        with self._cond:
            queue = self._queues.get(tp)
            return queue[0].split.available_at if queue else None

    def inflight_partitions(self) -> set[TopicPartition]:
        with self._cond:
            return set(self._queues)

    def join(self, timeout: float) -> bool:
        """Wait until nothing is in flight; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queues:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.1))
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Kill what is in flight and stop once every split is resolved (the build stage
        resolves the futures of splits it had not built: close it right after this)."""
        self.kill_all(KillReason.SHUTDOWN, within_s=min(timeout, 10.0))
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Wait for the publish thread to settle what is left (after :meth:`close`)."""
        self._thread.join(timeout)

    # -- internals ---------------------------------------------------------------------

    def _wake(self, _future: object = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _next_ready(self) -> _Entry | None:
        for queue in self._queues.values():
            if queue[0].built.done():
                return queue[0]
        return None

    def _publish_loop(self) -> None:
        while True:
            with self._cond:
                entry = self._next_ready()
                while entry is None:
                    if self._closing and not self._queues:
                        return
                    self._cond.wait(0.1)
                    entry = self._next_ready()
            # A cancelled build (shutdown) is done too: it resolves as Killed below.
            outcome = self._settler.settle(entry.split, entry.built, entry.spec_version)
            self._record(entry, outcome)

    def _record(self, entry: _Entry, outcome: Outcome) -> None:
        later: list[SealedSplit] = []
        with self._cond:
            queue = self._queues[entry.split.tp]
            assert queue[0] is entry
            queue.popleft()
            if not isinstance(outcome, Published | Killed):
                later = [e.split for e in queue]
            if not queue:
                del self._queues[entry.split.tp]
            self._inflight_count -= 1
            self._inflight_bytes -= entry.split.estimated_bytes
            self._outcomes.append(outcome)
            self._cond.notify_all()
        trip(later, KillReason.PREDECESSOR_FAILED, None)


def trip(splits: list[SealedSplit], reason: KillReason, within_s: float | None) -> int:
    """Trip the switches of ``splits``, all within ``within_s`` (None: KILL_WAIT_S each)."""
    deadline = None if within_s is None else time.monotonic() + within_s
    tripped = 0
    for split in splits:
        if split.kill_switch.tripped:
            continue
        timeout = KILL_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
        if not split.kill_switch.trip(reason, timeout=timeout):
            log.warning(
                "kill_switch_commit_in_progress",
                split=str(split.id),
                topic=split.tp.topic,
                partition=split.tp.partition,
            )
        tripped += 1
    return tripped
