"""The worker's Spark Connect session (``sc://``): the client's retries bounded, and a session
the server lost replaced by a fresh one before the next build.

pyspark's Connect client retries an unreachable server inside every call for 10 minutes or
more (its ``DefaultPolicy``): a build, a job interrupt and ``stop()`` would all wait that long.
Here each call gives up once its next retry would start more than ``retry_s`` after the call
began (:class:`BoundedPolicy`, on :data:`CONNECT_RETRY`'s schedule), so a build on a
dead server fails within that bound and goes through the pipeline's build retries like any
failed build: the same splits built again, published once, or failed and rewound.

A restarted server does not know the client's session: its first answer is
INVALID_HANDLE.SESSION_CHANGED, after which the client is closed for good (NO_ACTIVE_SESSION
on every call). :class:`ConnectSessions` is the one owner of the worker's session: a build
takes the current one and reports how it failed; a failure saying the session is gone, or the
server unreachable (whose channel may sit in gRPC's reconnect backoff), makes the next build
start on a fresh session. Replaced and stopped sessions are closed on a thread of their own,
never waited for longer than the bound.

Imported only where a Connect session is made (it imports pyspark's Connect client).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState

from ingest.abandoned import abandon
from ingest.errors import BuildError, first_line
from ingest.spark.session import SessionSource, session_conf
from ingest_common.backoff import Backoff
from ingest_common.model import SparkConnectEvent

log = structlog.get_logger(__name__)

# Before the n-th retry of one Connect call: 0.2 s, 0.4 s, ... 5 s; the bound ends it.
CONNECT_RETRY = Backoff(0.2, 5.0)
# INGEST_SPARK_CONNECT_RETRY_S's default: how long one call keeps retrying an unreachable server.
CONNECT_RETRY_S = 30.0

# What the client or the server says when the server-side session is gone: the client closed
# itself (NO_ACTIVE_SESSION), a restarted server (SESSION_CHANGED, the client's integrity
# check), a session the server released or expired.
_SESSION_GONE = (
    "NO_ACTIVE_SESSION",
    "INVALID_HANDLE.SESSION_CHANGED",
    "INVALID_HANDLE.SESSION_CLOSED",
    "INVALID_HANDLE.SESSION_NOT_FOUND",
    "server side session identifier",
)


class BoundedPolicy(DefaultPolicy):
    """pyspark's DefaultPolicy as to which errors are retried (UNAVAILABLE, a cursor another
    call preempted, anything carrying RetryInfo), on ``schedule`` instead of its own, and over
    at most ``total_s`` from the call's start. A server's RetryInfo delay is not
    honoured: it could stretch the waits past the bound."""

    def __init__(self, total_s: float, schedule: Backoff = CONNECT_RETRY) -> None:
        super().__init__(recognize_server_retry_delay=False, max_retries=None, jitter=0)
        self.total_s = total_s
        self.schedule = schedule

    def to_state(self) -> RetryPolicyState:
        return _BoundedState(self)


class _BoundedState(RetryPolicyState):
    """One call's retries (pyspark makes one state per call, as the call begins)."""

    def __init__(self, policy: BoundedPolicy) -> None:
        super().__init__(policy)
        self._bounded = policy
        self._began = policy.schedule.clock.monotonic()
        self._retries = 0

    def next_attempt(self, exception: BaseException | None = None) -> int | None:
        """Milliseconds to wait before the next attempt, or None: give up (the call raises).
        No retry starts later than ``total_s`` after the call began."""
        schedule = self._bounded.schedule
        delay = schedule.delay(self._retries)
        if schedule.clock.monotonic() + delay - self._began > self._bounded.total_s:
            return None
        self._retries += 1
        return round(delay * 1000)


def loss_of(session: Any | None, exc: BaseException) -> SparkConnectEvent | None:
    """Whether ``exc`` (raised by a call on ``session``) means the session cannot be used
    again: SESSION_LOST (the server does not know it, or the client closed it), UNREACHABLE
    (the call gave up on the server). None for any other failure (a job's own error)."""
    if session is not None and session.is_stopped:
        return SparkConnectEvent.SESSION_LOST
    condition = exc.getCondition() if hasattr(exc, "getCondition") else None
    text = f"{condition or ''} {exc}"
    if any(marker in text for marker in _SESSION_GONE):
        return SparkConnectEvent.SESSION_LOST
    # pyspark's SparkConnectGrpcException, or a grpc.RpcError a call let through.
    if hasattr(exc, "getGrpcStatusCode"):
        code = exc.getGrpcStatusCode()
    elif callable(getattr(exc, "code", None)):
        code = exc.code()  # type: ignore[attr-defined]
    else:
        code = None
    return SparkConnectEvent.UNREACHABLE if getattr(code, "name", None) == "UNAVAILABLE" else None


def connect_session(url: str, conf: Mapping[str, str], retry_s: float, *, wait_s: float | None = None) -> Any:
    """A new Connect session whose every call retries within ``retry_s``, the bounded policy in
    place before its first call (the one that sets ``conf``), which waits ``wait_s`` for the
    server (a worker's start: the server may be starting too; default ``retry_s``). Never
    pyspark's default or active session: its one owner hands it out."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # What pyspark's builder sets for an sc:// master: its functions build Connect plans, process-wide.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = ConnectSession(connection=url)
    session.client.set_retry_policies([BoundedPolicy(retry_s if wait_s is None else wait_s)])
    try:
        # Runtime SQL settings, as pyspark's builder applies them (one call; static ones ignored).
        session.conf._set_all(configs=dict(conf), silent=True)
    except BaseException:
        close_session(session, release=False, wait_s=0.0)
        raise
    session.client.set_retry_policies([BoundedPolicy(retry_s)])
    return session


def close_session(session: Any, *, release: bool, wait_s: float) -> bool:
    """Stop ``session`` on a thread of its own, releasing it on the server first when
    ``release`` (one call, within the session's retry bound); wait for that at most
    ``wait_s``. True when it finished within the wait; otherwise the thread is abandoned
    (ingest.spark.session.start_abandoned: the process exits without waiting for it)."""

    def stop() -> None:
        try:
            session.release_session_on_close = release
            session.stop()
        except Exception as exc:  # the client logs and swallows its own; nothing else to do
            log.warning("spark_connect_close_failed", error=first_line(exc))

    thread = threading.Thread(target=stop, name="spark-connect-close", daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        abandon(thread)
        return False
    return True


class ConnectSessions(SessionSource):
    """A role's one Connect session (a worker's, a compactor's). States: usable (``_lost``
    None), lost (the next :meth:`current` replaces it), stopped (for good). Builds on a
    replaced session that fail afterwards are ignored: only a failure of the current session
    marks it lost."""

    def __init__(
        self,
        url: str,
        app_name: str,
        *,
        retry_s: float = CONNECT_RETRY_S,
        first: Any | None = None,
        on_event: Callable[[SparkConnectEvent], None] = lambda _event: None,
    ) -> None:
        self._url = url
        # What create_session sets on a Connect session (ingest.spark.session).
        self._conf = {"spark.app.name": app_name, **session_conf(url)}
        self.retry_s = retry_s
        self._on_event = on_event
        # _lock guards the state below, briefly; _creating is held while a session is made.
        self._lock = threading.Lock()
        self._creating = threading.Lock()
        self._session = first
        # Why the next current() starts a fresh session (None: the current one is usable).
        self._lost: SparkConnectEvent | None = None if first is not None else SparkConnectEvent.SESSION_LOST
        self._stopped = False

    def current(self) -> Any:
        """The session for the next build; a fresh one when the last was lost (one thread
        makes it, the others wait for it). Raises BuildError when stopped, and whatever the
        new session's first call raised."""
        with self._creating:  # never taken by stop(): a creation on a dead server never holds it
            with self._lock:
                if self._stopped:
                    raise BuildError("the Spark Connect session is stopped (the worker is stopping)")
                if self._session is not None and self._lost is None:
                    return self._session
                old, reason = self._session, self._lost
            started = time.monotonic()
            try:
                session = connect_session(self._url, self._conf, self.retry_s)
            except Exception as exc:
                if loss_of(None, exc) is SparkConnectEvent.UNREACHABLE:
                    self._report(SparkConnectEvent.UNREACHABLE, exc, while_="creating a session")
                raise
            with self._lock:
                stopped = self._stopped
                if not stopped:
                    self._session, self._lost = session, None
        if stopped:
            close_session(session, release=True, wait_s=0.0)
            raise BuildError("the Spark Connect session is stopped (the worker is stopping)")
        if old is not None:
            # A lost session's server is gone or forgot it: nothing to release. One that was
            # unreachable may be back: released, within the bound, off this thread.
            close_session(old, release=reason is SparkConnectEvent.UNREACHABLE and not old.is_stopped, wait_s=0.0)
        log.info(
            "spark_connect_session_recreated",
            spark_master=self._url,
            reason=str(reason),
            session=session.session_id,
            previous=None if old is None else old.session_id,
            seconds=round(time.monotonic() - started, 2),
        )
        self._on_event(SparkConnectEvent.SESSION_RECREATED)
        return session

    def peek(self) -> Any | None:
        with self._lock:
            return None if self._stopped else self._session

    def failed(self, session: Any, exc: BaseException) -> None:
        loss = loss_of(session, exc)
        if loss is None:
            return
        with self._lock:
            if self._stopped or session is not self._session or self._lost is not None:
                return  # a replaced session, or reported already
            self._lost = loss
        self._report(loss, exc, while_="building")

    def stop(self) -> None:
        """Release the session on the server and close it; a server known gone is not asked,
        and one that does not answer is waited for at most the retry bound."""
        with self._lock:
            self._stopped = True
            session, self._session = self._session, None
            lost = self._lost
        if session is None:
            return
        started = time.monotonic()
        if not close_session(session, release=lost is None and not session.is_stopped, wait_s=self.retry_s):
            log.warning("spark_connect_stop_abandoned", waited_s=round(time.monotonic() - started, 2))

    def _report(self, event: SparkConnectEvent, exc: BaseException, *, while_: str) -> None:
        name = f"spark_connect_{event}"  # spark_connect_unreachable, spark_connect_session_lost
        log.warning(
            name,
            spark_master=self._url,
            during=while_,
            retry_s=self.retry_s,
            error=first_line(exc),
        )
        self._on_event(event)
