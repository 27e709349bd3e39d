"""The Spark Connect session's bounded retries and its owner's states, without a server (the
real server's outage: tests/acceptance/test_connect_outage.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from pyspark.errors import PySparkAssertionError
from pyspark.errors.exceptions.connect import SparkConnectException, SparkConnectGrpcException
from pyspark.sql.connect.client.retries import Retrying

from ingest.errors import BuildError, first_line
from ingest.spark import connect
from ingest.spark.connect import BoundedPolicy, ConnectSessions, loss_of
from ingest_common.backoff import Backoff
from ingest_common.model import SparkConnectEvent
from tests.fakes import FakeClock


class Unavailable(grpc.RpcError):
    """What a call to a dead server raises inside the client's retries."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def trailing_metadata(self) -> tuple[Any, ...]:
        return ()


def test_a_call_to_a_dead_server_gives_up_within_the_bound() -> None:
    clock = FakeClock()
    policy = BoundedPolicy(30.0, Backoff(0.2, 5.0, clock=clock))
    attempts = 0
    started = clock.monotonic()
    with pytest.raises(Unavailable), pytest.warns(UserWarning, match="RETRIES_EXCEEDED"):
        for attempt in Retrying([policy], sleep=clock.sleep):
            with attempt:
                attempts += 1
                raise Unavailable()
    assert clock.sleeps == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    assert clock.monotonic() - started <= 30.0
    assert attempts == len(clock.sleeps) + 1
    # pyspark's own policy would have waited through 15 retries, ten minutes and more.


def test_the_bound_counts_the_attempts_own_time_too() -> None:
    clock = FakeClock()
    policy = BoundedPolicy(10.0, Backoff(0.2, 5.0, clock=clock))
    with pytest.raises(Unavailable), pytest.warns(UserWarning, match="RETRIES_EXCEEDED"):
        for attempt in Retrying([policy], sleep=clock.sleep):
            with attempt:
                clock.advance(4.0)  # each attempt hangs 4 s before it fails
                raise Unavailable()
    assert clock.sleeps == [0.2, 0.4]


def test_no_retries_at_a_zero_bound() -> None:
    clock = FakeClock()
    policy = BoundedPolicy(0.0, Backoff(0.2, 5.0, clock=clock))
    assert policy.to_state().next_attempt(Unavailable()) is None


class FakeSession:
    made = 0

    def __init__(self) -> None:
        FakeSession.made += 1
        self.session_id = f"s{FakeSession.made}"
        self.is_stopped = False


def test_what_a_failure_says_about_the_session() -> None:
    session = FakeSession()
    unavailable = SparkConnectGrpcException(message="connection refused", grpc_status_code=grpc.StatusCode.UNAVAILABLE)
    assert loss_of(session, unavailable) is SparkConnectEvent.UNREACHABLE
    assert loss_of(session, Unavailable()) is SparkConnectEvent.UNREACHABLE
    gone = SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={})
    assert loss_of(session, gone) is SparkConnectEvent.SESSION_LOST
    changed = PySparkAssertionError("Received incorrect server side session identifier for request.")
    assert loss_of(session, changed) is SparkConnectEvent.SESSION_LOST
    # A job's own failure says nothing about the session.
    assert loss_of(session, ValueError("bad plan")) is None
    internal = SparkConnectGrpcException(message="boom", grpc_status_code=grpc.StatusCode.INTERNAL)
    assert loss_of(session, internal) is None
    session.is_stopped = True  # the client closed itself (the server answered SESSION_CHANGED)
    assert loss_of(session, ValueError("anything")) is SparkConnectEvent.SESSION_LOST


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> tuple[ConnectSessions, list[SparkConnectEvent], list[Any]]:
    closed: list[Any] = []
    monkeypatch.setattr(connect, "connect_session", lambda *_a, **_k: FakeSession())
    monkeypatch.setattr(
        connect, "close_session", lambda session, *, release, wait_s: closed.append((session, release)) or True
    )
    events: list[SparkConnectEvent] = []
    return ConnectSessions("sc://127.0.0.1:1", "t", first=FakeSession(), on_event=events.append), events, closed


def test_a_lost_session_is_replaced_once_before_the_next_build(
    sessions: tuple[ConnectSessions, list[SparkConnectEvent], list[Any]],
) -> None:
    owner, events, closed = sessions
    first = owner.current()
    assert owner.current() is first
    owner.failed(first, ValueError("a job's own error"))
    assert owner.current() is first and events == []
    owner.failed(first, SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={}))
    owner.failed(first, SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={}))
    assert events == [SparkConnectEvent.SESSION_LOST]
    second = owner.current()
    assert second is not first and owner.current() is second
    assert events == [SparkConnectEvent.SESSION_LOST, SparkConnectEvent.SESSION_RECREATED]
    assert closed == [(first, False)]  # the server forgot it: nothing to release
    # A build still on the replaced session fails later: the current one stays.
    owner.failed(first, Unavailable())
    assert owner.current() is second and len(events) == 2
    # Unreachable: replaced too (a fresh channel), the old one released if the server is back.
    owner.failed(second, Unavailable())
    third = owner.current()
    assert third is not second and closed[-1] == (second, True)
    assert events[2:] == [SparkConnectEvent.UNREACHABLE, SparkConnectEvent.SESSION_RECREATED]


def test_a_stop_does_not_ask_a_server_known_gone(
    sessions: tuple[ConnectSessions, list[SparkConnectEvent], list[Any]],
) -> None:
    owner, _events, closed = sessions
    first = owner.current()
    owner.failed(first, Unavailable())
    owner.stop()
    assert closed == [(first, False)]
    assert owner.peek() is None
    with pytest.raises(BuildError):
        owner.current()


def test_a_grpc_error_is_shown_by_its_status_and_details() -> None:
    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "failed to connect to all addresses"

        def __str__(self) -> str:
            return "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE"

    Refused.__module__ = "grpc._channel"
    assert first_line(Refused()) == "UNAVAILABLE: failed to connect to all addresses"


def test_a_stop_does_not_wait_for_a_session_being_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build thread making a session on a dead server holds its creation for up to the
    retry bound; the stop (SIGTERM) goes on meanwhile, and the session made after it is closed."""
    import threading

    creating, release = threading.Event(), threading.Event()
    closed: list[Any] = []

    def slow_session(*_a: Any, **_k: Any) -> FakeSession:
        creating.set()
        release.wait(10)
        return FakeSession()

    monkeypatch.setattr(connect, "connect_session", slow_session)
    monkeypatch.setattr(
        connect, "close_session", lambda session, *, release, wait_s: closed.append((session, release)) or True
    )
    owner = ConnectSessions("sc://127.0.0.1:1", "t")  # no first session: the first build makes one
    outcome: list[BaseException] = []

    def build() -> None:
        try:
            owner.current()
        except BuildError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    assert creating.wait(10)
    owner.stop()  # returns while the session is still being made
    release.set()
    thread.join(10)
    assert len(outcome) == 1 and len(closed) == 1
