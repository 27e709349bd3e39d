"""Whether a table committer can do its job: ``/healthz`` and ``/readyz`` of ``ingest
table-commit``, served by :class:`ingest.ops.endpoints.Endpoints` as the worker's are.

- Healthy: the committer's passes keep ending, and do not keep failing. It is unhealthy once
  every pass has failed for longer than ``unhealthy_after_s`` (PostgreSQL, i.e. the metastore
  and the catalog, unreachable; a store it cannot read; commit conflicts without end), once
  nothing ended (a pass, a commit attempt) for longer than that bound plus the longest wait
  between passes (a hung call), or once its loop stopped. A standby is healthy: it is ready to
  take over the moment the active committer's lock is released.
- Ready: healthy and active (holding the source's lock, committing). A standby answers 503
  ``standby``, so that the two are told apart; a Deployment running two committers must not
  make this its readinessProbe (a standby is not a fault), only its liveness probe /healthz.

Written by the committer's thread, read by the HTTP threads: every read and write of the
fields is under one lock, so a probe never sees half of an update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)


class CommitterState(StrEnum):
    STARTING = "starting"
    ACTIVE = "active"
    STANDBY = "standby"
    STOPPED = "stopped"


class CommitterHealth:
    def __init__(
        self,
        source: str,
        unhealthy_after_s: float,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``idle_s``: the longest the committer waits between passes (no progress is expected
        while it waits)."""
        self._source = source
        self._bound = unhealthy_after_s
        self._stall_bound = unhealthy_after_s + idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CommitterState.STARTING
        self._progress_at = clock()
        # First failure of the current run of failed passes (None: the last pass succeeded).
        self._failing_since: float | None = None
        self._failures = 0
        self._last_error = ""
        self._reported = False
        self._stopped_reason = ""

    @property
    def state(self) -> CommitterState:
        with self._lock:
            return self._state

    def progressed(self) -> None:
        """A commit attempt ended (committed, or met a conflict it retries)."""
        with self._lock:
            self._progress_at = self._clock()

    def passed(self, state: CommitterState) -> None:
        """A pass ended without error, as the active committer or as a standby."""
        with self._lock:
            if self._reported:
                log.info("table_committer_healthy", source=self._source, state=state.value)
            self._state = state
            self._progress_at = self._clock()
            self._failing_since = None
            self._failures = 0
            self._reported = False

    def failed(self, error: str) -> None:
        """A pass failed with an error the loop retries."""
        with self._lock:
            now = self._clock()
            self._progress_at = now
            if self._failing_since is None:
                self._failing_since = now
            self._failures += 1
            self._last_error = error
            if not self._reported and now - self._failing_since > self._bound:
                self._reported = True
                log.error("table_committer_unhealthy", source=self._source, reason=self._failing())

    def stopped(self, reason: str) -> None:
        """The loop ended (stopped, or an error it does not retry)."""
        with self._lock:
            self._state = CommitterState.STOPPED
            self._stopped_reason = reason

    def _failing(self) -> str:
        assert self._failing_since is not None
        seconds = self._clock() - self._failing_since
        return f"{self._failures} pass(es) failed in a row over {seconds:.0f} s; last: {self._last_error}"

    def healthy(self) -> tuple[bool, str]:
        with self._lock:
            if self._state is CommitterState.STOPPED:
                return False, f"stopped: {self._stopped_reason}"
            now = self._clock()
            if self._failing_since is not None:
                if now - self._failing_since > self._bound:
                    return False, self._failing()
                return True, f"{self._state.value}, retrying: {self._failing()}"
            stalled = now - self._progress_at
            if stalled > self._stall_bound:
                return False, f"{self._state.value}: no pass or commit attempt ended for {stalled:.0f} s"
            return True, self._state.value

    def ready(self) -> tuple[bool, str]:
        ok, reason = self.healthy()
        with self._lock:
            if not ok or self._failing_since is not None:
                return False, reason
            if self._state is CommitterState.STANDBY:
                return False, f"standby: another committer holds the lock of source {self._source!r}"
            return self._state is CommitterState.ACTIVE, reason
