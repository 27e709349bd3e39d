"""The loop of a singleton role (ingest.roles.runner) with a fake role: standby while another
holds the lock, active once it gets it; retried errors back off on an injected clock, any other
error ends the role with its health saying why; a pass that goes past its deadline makes the
health fail with the reason, is asked to stop and loses the lock to a standby, and counts as a
failed pass once it returns (or, never returning, keeps the process unhealthy)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from ingest import abandoned
from ingest.roles.health import RoleHealth, RoleNames, RoleState
from ingest.roles.runner import RolePacing, run_singleton_role
from ingest_common.backoff import Backoff
from ingest_dev.testkit import wait_until
from tests.fakes import FakeClock

NAMES = RoleNames(
    noun="fake",
    step="fake step",
    deadline_setting="INGEST_FAKE_PASS_DEADLINE_S",
    standby_event="fake_standby",
    active_event="fake_active",
    retry_event="fake_retry",
    unhealthy_event="fake_unhealthy",
    healthy_event="fake_healthy",
    past_deadline_event="fake_past_deadline",
    interrupted_event="fake_interrupted",
)


class Outage(Exception):
    """What the fake role retries."""


class Diverged(Exception):
    """What it does not."""


class AdvisoryLock:
    """One source's lock, for any number of fake roles."""

    def __init__(self) -> None:
        self.holder: object | None = None
        self._mutex = threading.Lock()

    def take(self, who: object) -> bool:
        with self._mutex:
            if self.holder is None:
                self.holder = who
            return self.holder is who

    def release(self, who: object) -> None:
        with self._mutex:
            if self.holder is who:
                self.holder = None


class FakeRole:
    """Its clock moves only by its own waits (each a millisecond of real time) or when a test
    moves it. ``script``: what each active pass does, in order (an exception: raised; "hang":
    wait until ``unhang`` is set; "until interrupted": raise Outage once interrupted), then
    nothing."""

    def __init__(self, lock: AdvisoryLock, script: list[object] | None = None, deadline_s: float = 60.0) -> None:
        self.clock = FakeClock(on_sleep=lambda _s: time.sleep(0.001))
        self.health = RoleHealth(
            NAMES, "src", unhealthy_after_s=30, idle_s=8, pass_deadline_s=deadline_s, clock=self.clock.monotonic
        )
        self.pacing = RolePacing(poll_s=1.0, retry=Backoff(1.0, 8.0, clock=self.clock))
        self.lock = lock
        self.script = list(script or [])
        self.active_passes: list[float] = []  # when each began, on the clock
        self.standby_passes = 0
        self.active = False
        self.failures = 0
        self.interrupted = threading.Event()
        self.unhang = threading.Event()

    def try_lock(self) -> bool:
        return self.lock.take(self)

    def release_lock(self) -> None:
        self.lock.release(self)

    def holding(self, active: bool) -> None:
        self.active = active

    def active_pass(self) -> None:
        self.active_passes.append(self.clock.monotonic())
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Exception):
            raise step
        if step == "hang":
            self.unhang.wait()
        if step == "until interrupted":
            self.interrupted.wait()
            raise Outage("interrupted")

    def standby_pass(self) -> None:
        self.standby_passes += 1

    def interrupt(self) -> None:
        self.interrupted.set()  # and the pass goes on: one that does not listen

    def retried(self, exc: Exception) -> bool:
        return isinstance(exc, Outage)

    def failed(self) -> None:
        self.failures += 1


class Running:
    def __init__(self, role: FakeRole) -> None:
        self.role = role
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            run_singleton_role(self.role, self.stop)
        except BaseException as exc:
            self.error = exc

    def end(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


@pytest.fixture
def lock() -> AdvisoryLock:
    return AdvisoryLock()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for run in started:
        run.role.unhang.set()
        run.stop.set()
        run.thread.join(10)


def test_a_role_stands_by_while_another_holds_the_lock_and_is_active_once_it_gets_it(
    lock: AdvisoryLock, running: list[Running]
) -> None:
    other = object()
    assert lock.take(other)
    role = FakeRole(lock)
    with capture_logs() as logs:
        running.append(run := Running(role))
        wait_until(lambda: role.standby_passes >= 3, 10, "standby passes")
        assert role.health.state is RoleState.STANDBY and not role.active and role.active_passes == []
        assert role.health.healthy() == (True, "standby")
        assert role.health.ready() == (False, "standby: another fake holds the lock of source 'src'")
        lock.release(other)
        wait_until(lambda: len(role.active_passes) >= 2, 10, "active passes")
        assert role.health.state is RoleState.ACTIVE and role.active and lock.holder is role
        assert role.health.ready() == (True, "active")
        run.end()
    assert lock.holder is None and not role.active  # released at the end of the role
    assert role.health.healthy() == (False, "stopped: stop requested")
    # Each transition said once, however many passes it lasted.
    said = [e["event"] for e in logs if e["event"] in ("fake_standby", "fake_active")]
    assert said == ["fake_standby", "fake_active"]


def test_retried_errors_back_off_on_the_injected_clock_and_any_other_ends_the_role_saying_why(
    lock: AdvisoryLock,
) -> None:
    script: list[object] = [Outage("pg down"), Outage("pg down"), Outage("pg down"), None, Outage("pg down")]
    role = FakeRole(lock, [*script, Diverged("table holds commit 3, the metastore 1")])
    with capture_logs() as logs, pytest.raises(Diverged):
        run_singleton_role(role, threading.Event())
    began = role.active_passes
    # 1, 2, 4 s after the failures, the poll (1 s) after the good pass, and 1 s again: a good pass
    # starts the backoff over.
    assert [round(b - a, 6) for a, b in itertools.pairwise(began)] == [1, 2, 4, 1, 1]
    assert [e["retry_in_s"] for e in logs if e["event"] == "fake_retry"] == [1, 2, 4, 1]
    assert role.failures == 4
    assert role.health.healthy() == (False, "stopped: table holds commit 3, the metastore 1")
    assert role.health.ready()[0] is False
    assert lock.holder is None and not role.active


def test_a_pass_past_its_deadline_fails_the_health_loses_the_lock_to_a_standby_and_fails_when_it_returns(
    lock: AdvisoryLock, running: list[Running]
) -> None:
    first, second = FakeRole(lock, ["hang"]), FakeRole(lock)
    with capture_logs() as logs:
        running.append(Running(first))
        wait_until(lambda: first.active_passes, 10, "the first role's pass")
        running.append(Running(second))
        wait_until(lambda: second.standby_passes >= 2, 10, "the second role to stand by")
        # Within its deadline, counted from the pass's start or its last step: alive and active.
        first.clock.advance(50)
        first.health.progressed()
        first.clock.advance(50)
        assert first.health.healthy() == (True, "active") and first.health.past_deadline() is None
        first.clock.advance(11)
        wait_until(lambda: lock.holder is second, 10, "the standby to take the lock")
        assert first.interrupted.is_set() and not first.active
        expected = (
            "overrun: a pass went 61 s without a fake step ending, past its deadline of 60 s "
            "(INGEST_FAKE_PASS_DEADLINE_S); it was asked to stop and the lock released"
        )
        assert first.health.healthy() == (False, expected)
        assert first.health.ready() == (False, expected)
        wait_until(lambda: second.health.ready() == (True, "active"), 10, "the second role to be active")
        # A pass that never returns keeps the process unhealthy (an orchestrator restarts it),
        # and the loop starts no other.
        first.clock.advance(3600)
        time.sleep(0.3)
        assert not first.health.healthy()[0] and len(first.active_passes) == 1
        first.unhang.set()
        wait_until(lambda: first.health.healthy() == (True, "standby"), 10, "the first role to stand by")
    said = [e for e in logs if e["event"] in ("fake_past_deadline", "fake_retry")]
    assert [e["event"] for e in said] == ["fake_past_deadline", "fake_retry"], said
    assert said[0]["deadline_s"] == 60 and said[0]["without_progress_s"] >= 61
    assert said[1]["error"] == (
        "a pass ran past its deadline of 60 s (INGEST_FAKE_PASS_DEADLINE_S) and was asked to stop"
    )
    assert said[1]["retry_in_s"] == 1 + 2  # the backoff, and a standby's poll to take the lock first
    assert first.failures == 1 and len(first.active_passes) == 1


def test_a_stop_ends_the_role_without_the_pass_it_gave_up_on(lock: AdvisoryLock, running: list[Running]) -> None:
    role = FakeRole(lock, ["hang"])
    running.append(run := Running(role))
    wait_until(lambda: role.active_passes, 10, "the pass")
    role.clock.advance(61)
    wait_until(lambda: role.interrupted.is_set(), 10, "the interrupt")
    run.end()
    assert role.health.healthy() == (False, "stopped: stop requested, a pass past its deadline still running")
    assert lock.holder is None


def test_a_stop_interrupts_the_running_pass_and_ends_the_role_once_it_returns(
    lock: AdvisoryLock, running: list[Running]
) -> None:
    role = FakeRole(lock, ["until interrupted"])
    with capture_logs() as logs:
        running.append(run := Running(role))
        wait_until(lambda: role.active_passes, 10, "the pass")
        assert not role.interrupted.is_set()
        run.end()
    # Asked to stop at once, not after a whole pass: no retry, no failure counted.
    assert role.interrupted.is_set()
    assert role.health.healthy() == (False, "stopped: stop requested")
    assert lock.holder is None and role.failures == 0
    said = [e for e in logs if e["event"] in ("fake_interrupted", "fake_retry")]
    assert [(e["event"], e.get("error")) for e in said] == [("fake_interrupted", "interrupted")]


def test_a_pass_that_ignores_a_stop_is_left_behind_after_the_grace(lock: AdvisoryLock, running: list[Running]) -> None:
    role = FakeRole(lock, ["hang"])
    running.append(run := Running(role))
    wait_until(lambda: role.active_passes, 10, "the pass")
    run.stop.set()
    wait_until(lambda: role.interrupted.is_set(), 10, "the interrupt")
    time.sleep(0.3)
    assert run.thread.is_alive(), "the loop waits out the grace for the pass"
    role.clock.advance(role.pacing.stop_grace_s)
    run.end()
    assert role.health.healthy() == (
        False,
        "stopped: stop requested, a pass still running 15 s after it was asked to stop",
    )
    assert lock.holder is None
    # Left running on its daemon thread; the process exits without waiting for it.
    assert "ingest-fake-pass" in _abandoned()
    role.unhang.set()
    wait_until(lambda: "ingest-fake-pass" not in _abandoned(), 10, "the abandoned pass to end")


def _abandoned() -> set[str]:
    return {thread.name for thread in abandoned.alive()}


def test_a_noted_problem_keeps_the_role_healthy_and_unready_naming_it(
    lock: AdvisoryLock, running: list[Running]
) -> None:
    """What the table committer notes while its table refuses a segment: a restart would not cure
    it, so /healthz stays 200; /readyz says it with 503."""
    role = FakeRole(lock)
    running.append(run := Running(role))
    wait_until(lambda: len(role.active_passes) >= 2, 10, "active passes")
    role.health.note("table data refused segment(s) 7 (1 attempt(s): bad)")
    assert role.health.healthy() == (True, "active: table data refused segment(s) 7 (1 attempt(s): bad)")
    assert role.health.ready() == (False, "active: table data refused segment(s) 7 (1 attempt(s): bad)")
    role.health.note("")
    assert role.health.healthy() == role.health.ready() == (True, "active")
    run.end()
