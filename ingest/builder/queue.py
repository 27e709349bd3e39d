"""The build stage's queue: sealed splits in, a future per split out (its built segment, or why
there is none), settled in order by the publish stage (ingest.publish.queue). The queue knows
nothing of publishing: a split goes consume -> build -> publish and never back.

Build threads take every split waiting to be built (up to ``max_batch_splits``, once no other
split came for ``BATCH_QUIET_S``, at most ``linger_s`` after the oldest) and build them as one
batch, one Spark job: under load, batches grow by themselves and the per-job cost is paid once
per batch; when idle, a split is built alone. The splits of every partition due at one log-end
answer are submitted together (ingest.consume.loop), a millisecond apart: the quiet gap takes
them as one batch without adding the linger to every record's latency.

Invariants:
- Every submitted split's future resolves exactly once: built, failed (after ``attempts``
  builds that failed), killed, refused by the parse policy, or cancelled at close.
- A split whose build found the schema registry not answering, or holding a schema id the
  registry has not served yet (within its wait), is not failed: it waits in the queue and is
  built again on ``registry_retry``'s schedule, without using up an attempt, until it builds,
  its wait ends or it is killed (``registry_wait`` says which partitions wait).
- A killed split is never built: its future resolves as killed when a build thread takes it.
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
from ingest.builder.registry_wait import RegistryWait, RegistryWaits
from ingest.builder.writer_schemas import RegistryUnavailable
from ingest.errors import BuildError, SplitKilled
from ingest.spec.model import SourceSpec
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import BuiltSegment, KillReason

log = structlog.get_logger(__name__)

# A batch is taken once no split was submitted for this long: the cuts of one pass of the loop
# come within a millisecond of each other, the next pass's a log-end interval later.
BATCH_QUIET_S = 0.03
# Before the n-th retry of a split whose build failed: 1 s, 2 s, ... (attempts bounds them).
BUILD_RETRY = Backoff.linear(1.0)
# Before the n-th build of a split waiting for the schema registry: 1 s, 2 s, 4 s, ... 30 s,
# for as long as the registry does not answer.
REGISTRY_RETRY = Backoff(1.0, 30.0)


@dataclass(slots=True)
class _Entry:
    split: SealedSplit
    built: Future[BuiltSegment]
    # The spec current when the split was submitted: it is built with it.
    spec: SourceSpec
    submitted_at: float = field(default_factory=time.monotonic)
    # Waiting for the schema registry: not built again before this time (registry_retry's clock),
    # and how many builds found the registry not answering.
    retry_at: float = 0.0
    registry_waits: int = 0


class BuildQueue:
    def __init__(
        self,
        builder: SegmentBuilder,
        *,
        threads: int = 2,
        max_batch_splits: int = 8,
        linger_s: float = 0.5,
        attempts: int = 3,
        retry: Backoff = BUILD_RETRY,
        registry_retry: Backoff = REGISTRY_RETRY,
    ) -> None:
        self._builder = builder
        self._attempts = attempts
        self._retry = retry
        self._registry_retry = registry_retry
        self._registry_waits = RegistryWaits(registry_retry.clock)
        self._max_batch_splits = max_batch_splits
        self._linger_s = linger_s
        self._cond = threading.Condition()
        # Submitted, not yet taken by a build thread (oldest first).
        self._unbuilt: deque[_Entry] = deque()
        # When the latest split was submitted (time.monotonic()).
        self._last_submitted = 0.0
        # Batches being built: when each began (time.monotonic()), by build thread.
        self._running: dict[int, float] = {}
        self._closing = False
        self._threads = [
            threading.Thread(target=self._build_loop, name=f"ingest-build-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    # -- what the stages before and after it call ---------------------------------------

    def submit(self, split: SealedSplit, spec: SourceSpec) -> Future[BuiltSegment]:
        """Build ``split`` with ``spec``; the future resolves with its segment or why there is none."""
        future: Future[BuiltSegment] = Future()
        with self._cond:
            if self._closing:
                future.set_exception(SplitKilled(KillReason.SHUTDOWN))
                return future
            entry = _Entry(split, future, spec)
            self._unbuilt.append(entry)
            self._last_submitted = entry.submitted_at
            self._cond.notify_all()
        return future

    @property
    def registry_wait(self) -> RegistryWait | None:
        """The partitions whose splits wait for the schema registry, or None."""
        return self._registry_waits.current()

    def longest_build_s(self) -> float:
        """How long the oldest batch still building has been at it (0: none is)."""
        with self._cond:
            since = min(self._running.values(), default=None)
        return 0.0 if since is None else time.monotonic() - since

    def close(self, timeout: float = 30.0) -> None:
        """Resolve every split not built yet as killed (shutdown) and stop the build threads."""
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
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- build threads ----------------------------------------------------------------

    def _take_batch(self) -> list[_Entry] | None:
        """Wait for splits to build; None once closing. A batch has one spec (version)."""
        with self._cond:
            while True:
                while not (due := _due(self._unbuilt, self._registry_retry.clock.monotonic())):
                    if self._closing:
                        return None
                    self._cond.wait(0.1)
                # More splits may be on their way (the rest of a pass's cuts): wait while they
                # keep coming, up to the linger, to build them in one job instead of several.
                linger_until = due[0].submitted_at + self._linger_s
                while (
                    len(due) < self._max_batch_splits
                    and not self._closing
                    and (remaining := min(linger_until, self._last_submitted + BATCH_QUIET_S) - time.monotonic()) > 0
                ):
                    self._cond.wait(remaining)
                    due = _due(self._unbuilt, self._registry_retry.clock.monotonic())
                if due:  # another build thread may have taken them meanwhile
                    break
            spec = due[0].spec
            batch = [e for e in due if e.spec is spec][: self._max_batch_splits]
            taken = {id(e) for e in batch}
            self._unbuilt = deque(e for e in self._unbuilt if id(e) not in taken)
        # A future cancelled by close() is not built; one waiting for the registry runs
        # already (its first build started it).
        return [e for e in batch if e.built.running() or e.built.set_running_or_notify_cancel()]

    def _build_loop(self) -> None:
        me = threading.get_ident()
        while (batch := self._take_batch()) is not None:
            if not batch:
                continue
            with self._cond:
                self._running[me] = time.monotonic()
            try:
                self._build(batch)
            finally:
                with self._cond:
                    self._running.pop(me, None)

    def _build(self, batch: list[_Entry]) -> None:
        """Build a batch, retrying the splits whose build failed (not those killed or refused by
        the parse policy), and resolve every entry's future. A batch is one Spark job, so one
        split's failure (its offsets gone from the log, say) fails the whole batch: its splits
        are retried one per job, so that the others are not failed with it again."""
        attempt = 1
        groups = [batch]
        while groups:
            retry: list[_Entry] = []
            for group in groups:
                retry += self._attempt(group, attempt)
            if retry:
                # Cut short once every split to retry is killed (the next attempt drops them).
                self._retry.sleep_unless(self._retry.delay(attempt - 1), partial(_all_killed, [e.split for e in retry]))
                attempt += 1
            groups = [[entry] for entry in retry]

    def _attempt(self, group: list[_Entry], attempt: int) -> list[_Entry]:
        """Build ``group`` as one batch; resolve what is decided, return what is to be retried."""
        try:
            results = self._builder.build_batch([e.split for e in group], group[0].spec)
        except Exception as exc:  # a builder bug: fail the batch, never the thread
            log.exception("build_batch_failed", splits=len(group), error=str(exc))
            results = [exc] * len(group)
        retry: list[_Entry] = []
        for entry, result in zip(group, results, strict=True):
            if isinstance(result, RegistryUnavailable):
                self._wait_for_registry(entry, result)
                continue
            self._registry_waits.resolved(entry.split.id)
            if isinstance(result, BuildError) and attempt < self._attempts:
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
        return retry

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


def _due(unbuilt: Iterable[_Entry], now: float) -> list[_Entry]:
    """Entries to build now: all but those waiting for the registry whose retry is not due
    (a killed one is due at once: its build resolves it as killed)."""
    return [e for e in unbuilt if e.retry_at <= now or e.split.kill_switch.tripped]


def _all_killed(splits: list[SealedSplit]) -> bool:
    return all(split.kill_switch.tripped for split in splits)
