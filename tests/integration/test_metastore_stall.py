"""A metastore connection that stops answering, against a real PostgreSQL: a loopback proxy
that is paused (no byte forwarded, every socket kept open, as a black-holed path or a frozen
server looks from the client) between the metastore and the server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from structlog.testing import capture_logs

from ingest.consume.publish_watch import PublishWatch
from ingest.publish.publisher import Publisher
from ingest.publish.queue import PublishQueue
from ingest.publish.settle import Published
from ingest_common.backoff import Backoff
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_dev.tcp_proxy import TcpProxy
from ingest_dev.testkit import wait_until
from metastore import Metastore
from metastore.connection import ConnectionLimits, connect
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable
from metastore.migrations import yoyo_url
from tests.integration.test_metastore import item, register
from tests.kafka_splits import split_of

T0 = TopicPartition("events", 0)
# The server cancels a statement after 1 s; the client waits 1 s more for the reply.
LIMITS = ConnectionLimits(statement_timeout_s=1.0, reply_grace_s=1.0, connect_timeout_s=2)
REPLY_BOUND_S = LIMITS.reply_timeout_s


def through(proxy: TcpProxy, url: str) -> str:
    return make_conninfo(url, host="127.0.0.1", port=str(proxy.port))


@pytest.fixture
def store(database_url: str) -> Iterator[Metastore]:
    s = Metastore(database_url)
    s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "events", [0], "earliest")
    yield s
    s.close()


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    with TcpProxy(int(conninfo_to_dict(database_url)["port"])) as p:
        yield p


def within(bound_s: float, proxy: TcpProxy, call: Callable[[], object]) -> BaseException | object:
    """What ``call`` returned or raised, which it must do within ``bound_s`` (else the proxy
    is resumed, so that the call and the test end, and the test fails)."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    took = time.monotonic() - started
    if thread.is_alive():
        proxy.resume()
        thread.join(30)
        pytest.fail(f"still blocked after {took:.1f}s (bound {bound_s:g}s)")
    return outcome[0]


def tcp_options(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int, int]:
    sock = socket.socket(fileno=conn.pgconn.socket)
    try:
        return (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        )
    finally:
        sock.detach()  # the descriptor stays libpq's


def test_every_metastore_connection_has_keepalives_a_user_timeout_and_a_statement_timeout(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = ConnectionLimits(
        statement_timeout_s=9, keepalives_idle_s=11, keepalives_interval_s=3, keepalives_count=4, tcp_user_timeout_s=7
    )
    with Metastore(database_url, limits) as store:
        conn = store._connection()
        assert tcp_options(conn) == (1, 11, 3, 4, 7000)
        assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "9s"}
    # From the environment when not given (the worker's, the CLI's and the listener's
    # connections); a parameter the URL sets itself wins.
    monkeypatch.setenv("INGEST_DB_KEEPALIVES_IDLE_S", "12")
    monkeypatch.setenv("INGEST_DB_TCP_USER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("INGEST_DB_STATEMENT_TIMEOUT_S", "8")
    with connect(database_url) as conn:
        assert tcp_options(conn) == (1, 12, 10, 3, 2500)
        assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "8s"}
    with connect(make_conninfo(database_url, keepalives_idle="13")) as conn:
        assert tcp_options(conn)[1] == 13
    # The migrations' connection (yoyo) gets the TCP bounds, not the statement timeout.
    assert "keepalives_idle=12" in yoyo_url(database_url) and "statement_timeout" not in yoyo_url(database_url)


def test_a_publish_on_a_connection_that_stops_answering_ends_with_an_unknown_outcome_in_bound(
    store: Metastore, proxy: TcpProxy, database_url: str
) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    publish = item(store, T0, claim.serial, 0, 10)
    stalled = Metastore(through(proxy, database_url), LIMITS)
    stalled.ping()  # connected through the proxy
    proxy.pause()
    started = time.monotonic()
    outcome = within(REPLY_BOUND_S + 3, proxy, lambda: stalled.publish(publish))
    took = time.monotonic() - started
    proxy.resume()
    # Not a failure known for sure: the statement was sent and may have committed.
    assert isinstance(outcome, CommitOutcomeUnknown), outcome
    assert took >= REPLY_BOUND_S - 0.2, took
    # And so it may: the held statement reaches the server once the path works again, and
    # commits. A publisher that took the timeout for a refusal would now publish it twice or
    # delete the files of a published segment; it looks the split up first.
    wait_until(lambda: store.segment_for_split(publish.segment.split_id) is not None, 15, "the late commit")
    assert store.partition_state("src", T0) == (claim.serial, 10)
    stalled.close()


def test_once_the_session_is_ended_the_lookup_is_final(store: Metastore, proxy: TcpProxy, database_url: str) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    publish = item(store, T0, claim.serial, 0, 10)
    stalled = Metastore(through(proxy, database_url), LIMITS)
    stalled.ping()
    proxy.pause()
    unknown = within(REPLY_BOUND_S + 3, proxy, lambda: stalled.publish(publish))
    assert isinstance(unknown, CommitOutcomeUnknown), unknown
    session = unknown.session
    assert session is not None
    # Ended from another connection while the publish is still held on its way to it.
    wait_until(lambda: store.end_session(session), 10, "the session to end", interval=0.05)
    assert store.segment_for_split(publish.segment.split_id) is None
    proxy.resume()  # the held publish reaches a closed socket
    segment_id = store.publish(publish)  # the retry: the only commit
    assert store.segment_for_split(publish.segment.split_id) == segment_id
    assert store.partition_state("src", T0) == (claim.serial, 10)
    stalled.close()


def test_connecting_through_a_path_that_stops_answering_fails_in_bound(proxy: TcpProxy, database_url: str) -> None:
    proxy.pause()
    failed = within(LIMITS.connect_timeout_s + 3, proxy, lambda: Metastore(through(proxy, database_url), LIMITS).ping())
    assert isinstance(failed, MetastoreUnavailable), failed


def test_a_stuck_publish_makes_the_worker_unhealthy_until_it_finishes(
    store: Metastore, proxy: TcpProxy, database_url: str, tmp_path: Any
) -> None:
    """The publish queue's thread, the real publisher and metastore: the publish blocks on
    the silent connection, each attempt ends within the bound (errors reported), the health
    check says why, and once the path works the split is published exactly once."""
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    split = split_of(T0, 0, 10, serial=claim.serial)
    build = register(store, split.id)
    data = f"file:///st/src/segments/{build}"
    built: Future[BuiltSegment] = Future()
    built.set_result(BuiltSegment(split.id, data, (f"{data}/part-{split.id}.parquet",), 10, 100))
    errors: list[tuple[float, Exception]] = []
    proxied = Metastore(through(proxy, database_url), LIMITS)
    proxied.ping()  # connected through the proxy before it stops
    publisher = Publisher(
        proxied,
        "src",
        "w1",
        backoff=Backoff(0.1, 0.5),
        on_store_error=lambda exc: errors.append((time.monotonic(), exc)),
    )
    publishes = PublishQueue(publisher)
    watch = PublishWatch(publishes, source="src", worker_id="w1", bound_s=REPLY_BOUND_S + 1)
    try:
        with capture_logs() as logs:
            proxy.pause()
            paused_at = time.monotonic()
            publishes.submit(split, built, spec_version=1)

            def stalled() -> bool:
                watch.check()
                return watch.stalled_reason is not None

            wait_until(stalled, REPLY_BOUND_S + 10, "the health check to report the stuck publish", interval=0.05)
            reason = watch.stalled_reason
            assert reason is not None and f"publish of {T0} [0, 10) unfinished" in reason, reason
            # The publish call itself came back within its bound, as an unknown outcome.
            wait_until(lambda: bool(errors), REPLY_BOUND_S + 10, "the first attempt to end", interval=0.05)
            assert errors[0][0] - paused_at < REPLY_BOUND_S + 3 and isinstance(errors[0][1], CommitOutcomeUnknown)
            proxy.resume()

            def done() -> bool:
                watch.check()
                return publishes.inflight_count == 0

            wait_until(done, 30, "the publish to finish once the path works", interval=0.05)
        (outcome,) = publishes.poll()
        assert isinstance(outcome, Published), outcome
        assert watch.stalled_reason is None
        assert store.segment_for_split(split.id) == outcome.segment_id
        assert store.partition_state("src", T0) == (claim.serial, 10)
        events = [e["event"] for e in logs if e["event"].startswith("publish_stall")]
        assert events == ["publish_stalled", "publish_stall_ended"], events
    finally:
        proxy.resume()
        publishes.close(timeout=10)
        publishes.stop(timeout=10)
        proxied.close()
