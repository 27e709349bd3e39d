"""Whether a singleton role (the table committer, the compactor) can do its job: the state its
loop is in and the ``/healthz`` and ``/readyz`` of its process, served by
:class:`ingest.ops.endpoints.Endpoints` as the worker's are.

- Healthy: the role's passes keep ending, and do not keep failing. It is unhealthy once every
  pass has failed for longer than ``unhealthy_after_s`` (PostgreSQL unreachable, a store it
  cannot read, commit conflicts without end, Spark jobs that keep failing), once a pass has run
  past its deadline (``pass_deadline_s`` with no step of it ending: a commit attempt, a chunk
  compacted), or once nothing ended outside a pass for longer than ``unhealthy_after_s`` plus
  the longest wait between passes (the loop itself hung), or once its loop stopped. A pass past
  its deadline is asked to stop and the role's lock released (ingest.roles.runner); until the
  pass returns the process stays unhealthy, so an orchestrator restarts it if it never does. A
  standby is healthy: it is ready to take over the moment the active one's lock is released.
- Noted: a problem the role rides out without failing its passes, which a restart would not
  cure (the table committer: segments its table refused, kept pending and retried) is named
  by both probes; /healthz stays 200, /readyz answers 503 while it lasts.
- Ready: healthy, active (holding the source's lock), its last pass did not fail and nothing is
  noted. A standby
  answers 503 ``standby: another <role> holds the lock of source '<source>'``, so that the two
  are told apart; a Deployment running two must not make this its readinessProbe (a standby is
  not a fault), only its liveness probe /healthz.

Written by the role's loop (and a pass's steps, on the pass's thread), read by the HTTP thread:
every read and write of the fields is under one lock, so a probe never sees half an update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)


class RoleState(StrEnum):
    """Where the role stands with its lock. Moved only by :class:`RoleHealth`'s methods, which
    the role's loop calls: starting -> standby | active; standby <-> active; active or standby
    -> overrun (a pass past its deadline: the lock released, the pass asked to stop) -> standby
    | active once it returned; any -> stopped (final)."""

    STARTING = "starting"
    STANDBY = "standby"
    ACTIVE = "active"
    OVERRUN = "overrun"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class RoleNames:
    """What a role is called in its texts and log events (dashboards, alerts and runbooks use
    the event names: each role keeps its own)."""

    # "committer", "compactor": "another committer holds the lock".
    noun: str
    # What ends a step of its pass (progress): "commit attempt", "chunk".
    step: str
    # The setting of its pass deadline, named where the deadline is reported.
    deadline_setting: str
    # Log events: it stands by; it holds the lock; a pass failed (retried); every pass failed
    # past the bound; a pass ended well after that; a pass ran past its deadline; a pass
    # interrupted by a stop ended with an error.
    standby_event: str
    active_event: str
    retry_event: str
    unhealthy_event: str
    healthy_event: str
    past_deadline_event: str
    interrupted_event: str


class RoleHealth:
    def __init__(
        self,
        names: RoleNames,
        source: str,
        *,
        unhealthy_after_s: float,
        idle_s: float,
        pass_deadline_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``idle_s``: the longest the role waits between passes (no progress is expected while
        it waits). ``pass_deadline_s``: the longest a pass may go without a step ending."""
        self.names = names
        self.source = source
        self.pass_deadline_s = pass_deadline_s
        self._bound = unhealthy_after_s
        self._stall_bound = unhealthy_after_s + idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = RoleState.STARTING
        self._progress_at = clock()
        # When the running pass began or last ended a step (None: no pass runs).
        self._step_at: float | None = None
        # First failure of the current run of failed passes (None: the last pass succeeded).
        self._failing_since: float | None = None
        self._failures = 0
        self._last_error = ""
        self._reported = False
        self._stopped_reason = ""
        self._note = ""

    @property
    def state(self) -> RoleState:
        with self._lock:
            return self._state

    # -- the role's loop: its lock -----------------------------------------------

    def standby(self) -> bool:
        """Another process holds the lock. True when that is news (the loop logs it)."""
        return self._move(RoleState.STANDBY)

    def active(self) -> bool:
        """This process holds the lock. True when that is news (the loop logs it)."""
        return self._move(RoleState.ACTIVE)

    def overran(self) -> None:
        """The running pass went past its deadline: it was asked to stop and the lock released."""
        self._move(RoleState.OVERRUN)

    def stopped(self, reason: str) -> None:
        """The loop ended (stopped, or an error it does not retry)."""
        with self._lock:
            self._state = RoleState.STOPPED
            self._stopped_reason = reason or "stopped"

    def _move(self, state: RoleState) -> bool:
        with self._lock:
            if self._state is RoleState.STOPPED:
                return False
            news = self._state is not state
            self._state = state
            return news

    # -- the role's passes -----------------------------------------------------------

    def pass_started(self) -> None:
        with self._lock:
            self._step_at = self._progress_at = self._clock()

    def progressed(self) -> None:
        """A step of the running pass ended (a commit attempt, a chunk compacted): its deadline
        counts from here. Called from the pass's thread."""
        with self._lock:
            now = self._clock()
            self._progress_at = now
            if self._step_at is not None:
                self._step_at = now

    def passed(self) -> None:
        """A pass ended without error, as the active role or as a standby."""
        with self._lock:
            if self._reported:
                log.info(self.names.healthy_event, source=self.source, state=self._state.value)
            self._step_at = None
            self._progress_at = self._clock()
            self._failing_since = None
            self._failures = 0
            self._reported = False

    def failed(self, error: str) -> None:
        """A pass failed with an error the loop retries (or ended past its deadline)."""
        with self._lock:
            now = self._clock()
            self._step_at = None
            self._progress_at = now
            if self._failing_since is None:
                self._failing_since = now
            self._failures += 1
            self._last_error = error
            if not self._reported and now - self._failing_since > self._bound:
                self._reported = True
                log.error(self.names.unhealthy_event, source=self.source, reason=self._failing())

    def note(self, problem: str) -> None:
        """A problem the passes ride out (see the module's docstring); "" when there is none."""
        with self._lock:
            self._note = problem

    def past_deadline(self) -> float | None:
        """Seconds the running pass has gone without a step ending, once past its deadline."""
        with self._lock:
            return self._overdue(self._clock())

    def _overdue(self, now: float) -> float | None:
        if self._step_at is None:
            return None
        running = now - self._step_at
        return running if running > self.pass_deadline_s else None

    # -- the probes --------------------------------------------------------------------

    def _failing(self) -> str:
        assert self._failing_since is not None
        seconds = self._clock() - self._failing_since
        return f"{self._failures} pass(es) failed in a row over {seconds:.0f} s; last: {self._last_error}"

    def healthy(self) -> tuple[bool, str]:
        with self._lock:
            if self._state is RoleState.STOPPED:
                return False, f"stopped: {self._stopped_reason}"
            now = self._clock()
            overdue = self._overdue(now)
            if overdue is not None:
                done = "; it was asked to stop and the lock released" if self._state is RoleState.OVERRUN else ""
                return False, (
                    f"{self._state.value}: a pass went {overdue:.0f} s without a {self.names.step} ending, "
                    f"past its deadline of {self.pass_deadline_s:g} s ({self.names.deadline_setting}){done}"
                )
            if self._failing_since is not None:
                if now - self._failing_since > self._bound:
                    return False, self._failing()
                return True, f"{self._state.value}, retrying: {self._failing()}"
            stalled = now - self._progress_at
            if self._step_at is None and stalled > self._stall_bound:
                return False, f"{self._state.value}: no pass or {self.names.step} ended for {stalled:.0f} s"
            return True, f"{self._state.value}: {self._note}" if self._note else self._state.value

    def ready(self) -> tuple[bool, str]:
        ok, reason = self.healthy()
        with self._lock:
            if not ok or self._failing_since is not None:
                return False, reason
            if self._state is RoleState.STANDBY:
                return False, f"standby: another {self.names.noun} holds the lock of source {self.source!r}"
            return self._state is RoleState.ACTIVE and not self._note, reason
