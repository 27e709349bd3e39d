"""Sealed splits in flight: built concurrently, published one at a time per partition in
offset order.

Build threads take every split waiting to be built (up to ``max_batch_splits``) and build
them as one batch, one Spark job: under load, batches grow by themselves and the per-job
cost is paid once per batch; when idle, a split is built alone at once.

Invariants:
- For each partition, splits are published strictly in the order they were submitted;
  a split is never published while an earlier split of its partition is unresolved.
- When a split of a partition fails or is refused, every later split of that partition
  still in flight is killed (they could only be refused: the stored offset did not move).
- Files of a split are deleted only when it is certain they were not published and never
  will be (ingest.publish.settle).
- Consumer calls never happen here: results go back to the polling thread via ``poll()``.
- A split whose build found the schema registry not answering is not failed: it waits, in
  its place, and is built again on ``registry_retry``'s schedule, without limit, until the
  registry answers or the split is killed (``registry_wait`` says which partitions wait).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import structlog

from ingest.builder.job import SegmentBuilder
from ingest.builder.writer_schemas import RegistryUnavailable
from ingest.errors import BuildError, SplitKilled
from ingest.publish.publisher import Publisher
from ingest.publish.registry_wait import RegistryWait, RegistryWaits
from ingest.publish.settle import Killed, Outcome, Published, PublishInProgress, Settler
from ingest.segments import store as segment_store
from ingest.spec import SourceSpec, SpecHolder
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import BuiltSegment, KillReason, TopicPartition

log = structlog.get_logger(__name__)

# Before the n-th retry of a split whose build failed: 1 s, 2 s, ... (build_attempts bounds them).
BUILD_RETRY = Backoff.linear(1.0)
# Before the n-th build of a split waiting for the schema registry: 1 s, 2 s, 4 s, ... 30 s,
# for as long as the registry does not answer.
REGISTRY_RETRY = Backoff(1.0, 30.0)


@dataclass(slots=True)
class _Entry:
    split: SealedSplit
    built: Future[BuiltSegment]
    # The spec current when the split was submitted: it is built and published with it.
    spec: SourceSpec
    spec_version: int = 0
    submitted_at: float = field(default_factory=time.monotonic)
    # Waiting for the schema registry: not built again before this time (registry_retry's clock),
    # and how many builds found the registry not answering.
    retry_at: float = 0.0
    registry_waits: int = 0


class Pipeline:
    def __init__(
        self,
        builder: SegmentBuilder,
        publisher: Publisher,
        specs: SpecHolder,
        *,
        build_threads: int = 2,
        max_batch_splits: int = 8,
        batch_linger_s: float = 0.5,
        build_attempts: int = 3,
        build_retry: Backoff = BUILD_RETRY,
        registry_retry: Backoff = REGISTRY_RETRY,
        publish_delay_s: float = 0.0,
    ) -> None:
        self._builder = builder
        self._settler = Settler(builder, publisher, publish_delay_s)
        # Read at each submit: a new spec version applies from the next split on.
        self._specs = specs
        self._build_attempts = build_attempts
        self._build_retry = build_retry
        self._registry_retry = registry_retry
        self._registry_waits = RegistryWaits(registry_retry.clock)
        self._max_batch_splits = max_batch_splits
        self._batch_linger_s = batch_linger_s
        self._cond = threading.Condition()
        self._queues: dict[TopicPartition, deque[_Entry]] = {}
        # Submitted, not yet taken by a build thread (oldest first).
        self._unbuilt: deque[_Entry] = deque()
        self._outcomes: list[Outcome] = []
        self._inflight_bytes = 0
        self._inflight_count = 0
        self._closing = False
        self._thread = threading.Thread(target=self._publish_loop, name="ingest-publish", daemon=True)
        self._thread.start()
        self._builders = [
            threading.Thread(target=self._build_loop, name=f"ingest-build-{i}", daemon=True)
            for i in range(build_threads)
        ]
        for thread in self._builders:
            thread.start()

    # -- polling thread API ------------------------------------------------------------

    def submit(self, split: SealedSplit) -> None:
        """Build and publish ``split`` with the spec version current now (a new version applies
        from the next submitted split on; splits already submitted keep theirs)."""
        spec, spec_version = self._specs.current()
        future: Future[BuiltSegment] = Future()
        entry = _Entry(split, future, spec, spec_version)
        with self._cond:
            self._queues.setdefault(split.tp, deque()).append(entry)
            if split.chunks:
                self._unbuilt.append(entry)
            else:
                # Offsets without records (transaction markers, aborted records): nothing to
                # build, but published in its place in the partition's order like any split.
                future.set_running_or_notify_cancel()
                future.set_result(
                    BuiltSegment(
                        split_id=split.id,
                        location=segment_store.source_root(spec.segment_store, spec.name),
                        files=(),
                        row_count=0,
                        size_bytes=0,
                    )
                )
            self._inflight_count += 1
            self._inflight_bytes += split.size_bytes
            self._cond.notify_all()
        future.add_done_callback(self._wake)

    def kill(self, tps: Iterable[TopicPartition], reason: KillReason, within_s: float | None = None) -> int:
        """Trip the kill switch of every in-flight split of these partitions. When this
        returns, none of them can start a commit (unless a commit in progress outlived
        ``within_s``, the time all of them may take; the metastore's serial check still fences it)."""
        wanted = set(tps)
        with self._cond:
            splits = [e.split for tp, q in self._queues.items() if tp in wanted for e in q]
        return self._trip(splits, reason, within_s)

    def kill_all(self, reason: KillReason, within_s: float | None = None) -> int:
        with self._cond:
            splits = [e.split for q in self._queues.values() for e in q]
        return self._trip(splits, reason, within_s)

    def poll(self) -> list[Outcome]:
        with self._cond:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    @property
    def publishing(self) -> PublishInProgress | None:
        """The split being published now, since when (read by ingest.consume.publish_watch)."""
        return self._settler.publishing

    @property
    def registry_wait(self) -> RegistryWait | None:
        """The partitions whose splits wait for the schema registry, or None."""
        return self._registry_waits.current()

    @property
    def inflight_count(self) -> int:
        return self._inflight_count

    @property
    def inflight_bytes(self) -> int:
        return self._inflight_bytes

    def oldest_pending_ms(self, tp: TopicPartition) -> int | None:
        """Kafka timestamp of the first record of the oldest unresolved split of ``tp``."""
        with self._cond:
            queue = self._queues.get(tp)
            if not queue:
                return None
            return queue[0].split.first_timestamp_ms()

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
        self.kill_all(KillReason.SHUTDOWN, within_s=min(timeout, 10.0))
        with self._cond:
            self._closing = True
            unbuilt, self._unbuilt = list(self._unbuilt), deque()
            self._cond.notify_all()
        for entry in unbuilt:
            # One waiting for the registry was built before (its future runs): resolved here.
            if not entry.built.cancel() and not entry.built.done():
                entry.built.set_exception(SplitKilled(KillReason.SHUTDOWN))
            self._registry_waits.resolved(entry.split.id)
        deadline = time.monotonic() + timeout
        for thread in self._builders:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _trip(splits: list[SealedSplit], reason: KillReason, within_s: float | None) -> int:
        deadline = None if within_s is None else time.monotonic() + within_s
        tripped = 0
        for split in splits:
            if split.kill_switch.tripped:
                continue
            timeout = 5.0 if deadline is None else max(0.0, deadline - time.monotonic())
            if not split.kill_switch.trip(reason, timeout=timeout):
                log.warning(
                    "kill_switch_commit_in_progress",
                    split=str(split.id),
                    topic=split.tp.topic,
                    partition=split.tp.partition,
                )
            tripped += 1
        return tripped

    def _wake(self, _future: object = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _take_batch(self) -> list[_Entry] | None:
        """Wait for splits to build; None once closing. A batch has one spec (version)."""
        with self._cond:
            while True:
                while not (due := _due(self._unbuilt, self._registry_retry.clock.monotonic())):
                    if self._closing:
                        return None
                    self._cond.wait(0.1)
                # Splits sealed by age come a few hundred milliseconds apart: waiting that
                # long for them makes one batch (one job) where there would be several.
                linger_until = due[0].submitted_at + self._batch_linger_s
                while (
                    len(due) < self._max_batch_splits
                    and not self._closing
                    and (remaining := linger_until - time.monotonic()) > 0
                ):
                    self._cond.wait(remaining)
                    due = _due(self._unbuilt, self._registry_retry.clock.monotonic())
                if due:  # another build thread may have taken them meanwhile
                    break
            spec = due[0].spec
            batch = [e for e in due if e.spec is spec][: self._max_batch_splits]
            taken = {id(e) for e in batch}
            self._unbuilt = deque(e for e in self._unbuilt if id(e) not in taken)
        # A future cancelled by close() is not built; it resolves as Killed("shutdown"). One
        # waiting for the registry runs already (its first build started it).
        return [e for e in batch if e.built.running() or e.built.set_running_or_notify_cancel()]

    def _build_loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            if batch:
                self._build(batch)

    def _build(self, batch: list[_Entry]) -> None:
        """Build a batch, retrying the splits whose build failed (not those killed or
        refused by the parse policy), and resolve every entry's future."""
        attempt = 1
        pending = batch
        while pending:
            try:
                results = self._builder.build_batch([e.split for e in pending], pending[0].spec)
            except Exception as exc:  # a builder bug: fail the batch, never the thread
                log.exception("build_batch_failed", splits=len(pending), error=str(exc))
                results = [exc] * len(pending)
            retry: list[_Entry] = []
            for entry, result in zip(pending, results, strict=True):
                if isinstance(result, RegistryUnavailable):
                    self._wait_for_registry(entry, result)
                    continue
                self._registry_waits.resolved(entry.split.id)
                if isinstance(result, BuildError) and attempt < self._build_attempts:
                    retry.append(entry)
                    log.warning(
                        "build_retry",
                        split=str(entry.split.id),
                        topic=entry.split.tp.topic,
                        partition=entry.split.tp.partition,
                        attempt=attempt,
                        error=str(result),
                    )
                elif isinstance(result, Exception):
                    entry.built.set_exception(result)
                else:
                    entry.built.set_result(result)
            if retry:
                # Cut short once every split to retry is killed (the next attempt drops them).
                self._build_retry.sleep_unless(
                    self._build_retry.delay(attempt - 1), partial(_all_killed, [e.split for e in retry])
                )
                attempt += 1
            pending = retry

    def _wait_for_registry(self, entry: _Entry, error: RegistryUnavailable) -> None:
        """Put the split back among those to build, due after the registry retry's backoff: it
        keeps its place in its partition's publish order, and no build attempt is used up."""
        delay = self._registry_retry.delay(entry.registry_waits)
        entry.registry_waits += 1
        # Due time first, then reported: whoever sees the wait sees when its retry is due.
        entry.retry_at = self._registry_retry.clock.monotonic() + delay
        self._registry_waits.waiting(entry.split, error, retry=entry.registry_waits, retry_in_s=delay)
        with self._cond:
            if self._closing:
                # close() has taken the queue already: resolve it here.
                entry.built.set_exception(SplitKilled(KillReason.SHUTDOWN))
                self._registry_waits.resolved(entry.split.id)
            else:
                self._unbuilt.append(entry)
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
            self._inflight_bytes -= entry.split.size_bytes
            self._outcomes.append(outcome)
            self._cond.notify_all()
        self._trip(later, KillReason.PREDECESSOR_FAILED, None)


def _due(unbuilt: Iterable[_Entry], now: float) -> list[_Entry]:
    """Entries to build now: all but those waiting for the registry whose retry is not due
    (a killed one is due at once: its build resolves it as killed)."""
    return [e for e in unbuilt if e.retry_at <= now or e.split.kill_switch.tripped]


def _all_killed(splits: list[SealedSplit]) -> bool:
    return all(split.kill_switch.tripped for split in splits)
