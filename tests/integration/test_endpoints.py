"""The metrics/health endpoint under idle and abusive clients, over real sockets."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from ingest.ops.endpoints import Endpoints
from ingest_dev.testkit import wait_until


@pytest.fixture
def port() -> Iterator[int]:
    registry = CollectorRegistry()
    Counter("probe_things", "things", registry=registry).inc()
    endpoints = Endpoints(
        registry, lambda: (True, "alive"), lambda: (True, "ready"), read_timeout_s=1.0, max_connections=4
    )
    yield endpoints.serve("127.0.0.1", 0)
    endpoints.close()


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.status, resp.read().decode()


def http_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("Thread-") and t.daemon)


def test_idle_sockets_hold_no_more_than_the_bound_and_scrapes_still_answer(port: int) -> None:
    before = http_threads()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(50)]
    try:
        time.sleep(0.3)
        assert http_threads() - before <= 4
        # Those past the bound were closed at once: reading gives end of file, not a wait.
        closed = 0
        for sock in idle[4:]:
            sock.settimeout(2)
            try:
                closed += sock.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += 0
        assert closed >= 40
        # The silent ones inside the bound are closed by the read timeout (1 s); then a new
        # client is served.
        time.sleep(1.5)
        status, body = get(port, "/metrics")
        assert status == 200 and "probe_things_total 1.0" in body
        assert get(port, "/healthz") == (200, "alive\n")
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: http_threads() <= before, 5, "the server's threads to end", interval=0.1)


def test_a_silent_client_is_disconnected_after_the_read_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closed it
        assert 0.8 <= time.monotonic() - started < 4


def test_health_reasons_are_redacted() -> None:
    # A reason quotes the last failure, whose message may quote a connection string.
    failing = "5 splits failed: build: cannot reach sc://spark:15002/;token=t0k3n-h1dden;user_id=ingest"
    endpoints = Endpoints(CollectorRegistry(), lambda: (False, failing), lambda: (False, failing))
    port = endpoints.serve("127.0.0.1", 0)
    try:
        for path in ("/healthz", "/readyz"):
            with pytest.raises(urllib.error.HTTPError) as err:
                get(port, path)
            body = err.value.read().decode()
            assert err.value.code == 503 and "t0k3n-h1dden" not in body and "token=***" in body, body
    finally:
        endpoints.close()
