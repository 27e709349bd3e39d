"""The loop of a role that runs on one process at a time per source (the table committer, the
compactor): ``run_singleton_role``.

- **Lock.** Each turn asks for the source's advisory lock of the role (``try_lock``; only this
  loop's thread touches the lock's connection). Held: an active pass. Held by another process:
  a standby pass (what a standby reports too: how far behind the table is, the store's shape),
  then a longer wait. The lock only saves work: each role's correctness rests on its own fence
  (the table committer's catalog swap, the compactor's replacement transaction), never on it.
- **Retry.** A pass that raises one of the role's retried errors (``SingletonRole.retried``:
  outages the next pass gets past) is counted, reported by the health and waited after on the
  role's :class:`Backoff` (reset by a good pass); any other error ends the role, and its health
  says why.
- **Pass deadline.** Every pass runs on the role's pass thread while this loop watches it. A
  pass that goes ``pass_deadline_s`` without a step ending (the committer: a commit attempt;
  the compactor: a chunk) is logged once (the role's ``past_deadline_event``) and reported by
  /healthz; it is asked to stop (``interrupt``: the compactor interrupts its Spark job) and the
  lock is released, so that a standby takes over. The loop then waits for the pass: once it
  returns, it counts as a failed pass, retried as above after a standby's poll period more (a
  standby takes the lock first); while it does not, the process stays unhealthy, so an
  orchestrator restarts it. A stop requested meanwhile ends the loop without it.
- **Stop.** A stop requested while a pass runs asks it to stop too (``interrupt``): nothing a
  pass leaves half done is visible, so a SIGTERM never waits for a whole backlog. The loop
  waits ``stop_grace_s`` for it on the role's clock, then leaves it running on its daemon
  thread (ingest.abandoned: the process exits without waiting for it).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Protocol

import structlog

from ingest.abandoned import abandon
from ingest.roles.health import RoleHealth
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line

log = structlog.get_logger(__name__)

# A standby tries the lock at most this often.
STANDBY_POLL_S = 2.0
# How often the loop looks at a running pass (its deadline; a stop once it was given up on), and
# how often a wait between passes looks at the stop event.
WATCH_SLICE_S = 0.1
# How long a stop waits for the pass it interrupted: well inside an orchestrator's grace
# period (Kubernetes' default is 30 s) once the endpoints and the Spark session are closed too.
STOP_GRACE_S = 15.0


@dataclass(frozen=True, slots=True)
class RolePacing:
    # Between two passes of the active role (the committer's poll, the compactor's --every).
    poll_s: float
    # After a failed pass; a good pass starts it again. Every wait is on its clock.
    retry: Backoff
    standby_poll_s: float = STANDBY_POLL_S
    stop_grace_s: float = STOP_GRACE_S

    @property
    def standby_wait_s(self) -> float:
        return max(self.poll_s, self.standby_poll_s)

    @property
    def idle_s(self) -> float:
        """The longest wait between two passes (the health's stall bound adds it)."""
        return max(self.poll_s, self.standby_poll_s, self.retry.max_s)


class SingletonRole(Protocol):
    """One role's parts; ``run_singleton_role`` calls them. ``try_lock``, ``release_lock``,
    ``holding``, ``interrupt``, ``retried`` and ``failed`` run on the loop's thread, the passes
    on the pass thread (one at a time)."""

    @property
    def health(self) -> RoleHealth: ...

    @property
    def pacing(self) -> RolePacing: ...

    def try_lock(self) -> bool:
        """Take, or still hold, the source's lock of the role; False while another holds it."""
        ...

    def release_lock(self) -> None: ...

    def holding(self, active: bool) -> None:
        """Whether this process is the active one (its metrics)."""
        ...

    def active_pass(self) -> None: ...

    def standby_pass(self) -> None: ...

    def interrupt(self) -> None:
        """Ask the running pass to stop (past its deadline). Never blocks."""
        ...

    def retried(self, exc: Exception) -> bool:
        """Whether a pass that raised ``exc`` is retried (else the role ends)."""
        ...

    def failed(self) -> None:
        """A pass failed and is retried (its metrics)."""
        ...


def run_singleton_role(role: SingletonRole, stop: threading.Event) -> None:
    """Run ``role`` until ``stop`` is set, or until a pass raises an error it does not retry
    (raised here; the health says why)."""
    _Loop(role, stop).run()


@dataclass(frozen=True, slots=True)
class _Outcome:
    error: BaseException | None
    # It went past its deadline (and was asked to stop, its lock released).
    late: bool = False
    # A stop was requested while it ran (it was asked to stop).
    stopped: bool = False
    # Still running when the loop gave up on it (a stop requested): why, else None.
    abandoned: str | None = None


class _Loop:
    def __init__(self, role: SingletonRole, stop: threading.Event) -> None:
        self._role = role
        self._stop = stop
        self._health = role.health
        self._names = role.health.names
        self._source = role.health.source
        self._pacing = role.pacing
        self._passes = _PassThread(f"ingest-{self._names.noun}-pass")
        self._failures = 0
        self._abandoned: str | None = None

    def run(self) -> None:
        reason = "stop requested"
        try:
            while not self._stop.is_set():
                self._turn()
            if self._abandoned is not None:
                reason = f"stop requested, {self._abandoned}"
        except BaseException as exc:
            reason = first_line(exc)
            raise
        finally:
            self._health.stopped(reason)
            self._role.holding(False)
            self._role.release_lock()
            self._passes.close()

    def _turn(self) -> None:
        role = self._role
        try:
            locked = role.try_lock()
        except Exception as exc:
            if not role.retried(exc):
                raise
            self._failed(first_line(exc))
            return
        if locked:
            if self._health.active():
                log.info(self._names.active_event, source=self._source)
            role.holding(True)
            outcome, wait_s = self._supervise(role.active_pass), self._pacing.poll_s
        else:
            if self._health.standby():
                log.info(self._names.standby_event, source=self._source)
            role.holding(False)
            outcome, wait_s = self._supervise(role.standby_pass), self._pacing.standby_wait_s
        error = outcome.error
        if outcome.abandoned is not None:
            self._abandoned = outcome.abandoned
        elif outcome.stopped:
            # Asked to stop with the loop: whatever it raised is the interrupt's doing.
            if error is not None:
                log.info(self._names.interrupted_event, source=self._source, error=first_line(error))
        elif error is not None and not (isinstance(error, Exception) and role.retried(error)):
            raise error
        elif outcome.late:
            # Its lock went: a standby's poll goes by before this process tries it again, so
            # that a standby takes over first.
            self._failed(
                f"a pass ran past its deadline of {self._health.pass_deadline_s:g} s "
                f"({self._names.deadline_setting}) and was asked to stop"
                + (f": {first_line(error)}" if error is not None else ""),
                yield_s=self._pacing.standby_wait_s,
            )
        elif error is not None:
            self._failed(first_line(error))
        else:
            self._health.passed()
            self._failures = 0
            self._wait(wait_s)

    def _supervise(self, work: Callable[[], None]) -> _Outcome:
        self._health.pass_started()
        future = self._passes.submit(work)
        late = False
        grace_ends: float | None = None
        clock = self._pacing.retry.clock
        while not wait([future], timeout=WATCH_SLICE_S).done:
            if not late and (running := self._health.past_deadline()) is not None:
                late = True
                self._give_up(running)
            if not self._stop.is_set():
                continue
            if late:
                return self._leave("a pass past its deadline still running", late=True)
            if grace_ends is None:
                grace_ends = clock.monotonic() + self._pacing.stop_grace_s
                self._role.interrupt()
            elif clock.monotonic() >= grace_ends:
                return self._leave(f"a pass still running {self._pacing.stop_grace_s:g} s after it was asked to stop")
        return _Outcome(future.exception(), late=late, stopped=grace_ends is not None)

    def _leave(self, why: str, late: bool = False) -> _Outcome:
        """The running pass is given up on: the process exits without waiting for it."""
        abandon(self._passes.thread)
        return _Outcome(None, late=late, abandoned=why)

    def _give_up(self, running_s: float) -> None:
        """The running pass is past its deadline: said once, asked to stop, the lock released."""
        log.error(
            self._names.past_deadline_event,
            source=self._source,
            deadline_s=self._health.pass_deadline_s,
            without_progress_s=round(running_s, 1),
            setting=self._names.deadline_setting,
        )
        self._health.overran()
        self._role.holding(False)
        self._role.release_lock()
        self._role.interrupt()

    def _failed(self, error: str, yield_s: float = 0.0) -> None:
        self._role.failed()
        self._role.holding(False)
        self._health.failed(error)
        delay = self._pacing.retry.delay(self._failures) + yield_s
        self._failures += 1
        log.warning(self._names.retry_event, source=self._source, error=error, retry_in_s=delay)
        self._wait(delay)

    def _wait(self, seconds: float) -> None:
        self._pacing.retry.sleep_unless(seconds, self._stop.is_set, poll_s=WATCH_SLICE_S)


class _PassThread:
    """The one thread a role's passes run on, one at a time (a Spark session's job tags belong to
    the thread that runs the job). A daemon: a pass given up on never holds the process's exit."""

    def __init__(self, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], None], Future[None]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, work: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._work.put((work, future))
        return future

    def close(self) -> None:
        """The thread ends after the pass it runs, if any."""
        self._work.put(None)

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            work, future = item
            future.set_running_or_notify_cancel()
            try:
                work()
            except BaseException as exc:  # handed to the loop, which decides
                future.set_exception(exc)
            else:
                future.set_result(None)
