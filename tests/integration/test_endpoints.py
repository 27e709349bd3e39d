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
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ingest.ops.endpoints import MAX_CONNECTIONS, Endpoints
from ingest_dev.testkit import wait_until


@pytest.fixture
def port() -> Iterator[int]:
    registry = CollectorRegistry()
    Counter("probe_things", "things", registry=registry).inc()
    endpoints = Endpoints(
        registry, lambda: (True, "alive"), lambda: (True, "ready"), request_timeout_s=1.0, max_connections=4
    )
    yield endpoints.serve("127.0.0.1", 0)
    endpoints.close()


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.status, resp.read().decode()


def closed_by_server(sock: socket.socket, timeout: float = 2.0) -> bool:
    """True when the server closed the connection (end of file or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except (TimeoutError, BlockingIOError):  # BlockingIOError: timeout 0, nothing to read
        return False


def test_idle_sockets_take_no_thread_and_no_more_than_the_bound(port: int) -> None:
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(50)]
    try:
        time.sleep(0.3)
        assert threading.active_count() == before
        # Past the bound (4) each new connection closed the oldest one still reading: the
        # first 46 were closed at once, the newest 4 are held until their deadline.
        assert sum(closed_by_server(sock) for sock in idle[:46]) == 46
        assert not any(closed_by_server(sock, 0.05) for sock in idle[46:])
        # A scrape is served at once, without waiting for a silent connection to expire.
        started = time.monotonic()
        status, body = get(port, "/metrics")
        assert status == 200 and "probe_things_total 1.0" in body
        assert get(port, "/healthz") == (200, "alive\n")
        assert time.monotonic() - started < 1.0
    finally:
        for sock in idle:
            sock.close()


def test_a_silent_client_is_disconnected_after_the_request_timeout(port: int) -> None:
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


# -- slow clients (slowloris): one byte at a time, never a whole request ---------------------

# The bytes a slow client trickles: the start of a request whose head never ends.
TRICKLE = b"GET /metrics HTTP/1.1\r\nHost: worker\r\nX-Padding: " + b"a" * 4096


class Trickler:
    """``clients`` connections, each sent one byte every ``every_s`` until ``for_s`` is up or
    the server closes it; records when each was closed (seconds after its connect)."""

    def __init__(self, port: int, clients: int, every_s: float, for_s: float) -> None:
        self._port, self._clients, self._every_s, self._for_s = port, clients, every_s, for_s
        self.cut_after: list[float | None] = [None] * clients
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        socks: list[socket.socket] = []
        opened: list[float] = []
        for _ in range(self._clients):
            socks.append(socket.create_connection(("127.0.0.1", self._port), timeout=5))
            opened.append(time.monotonic())
            time.sleep(0.01)  # one after the other, as separate clients would
        try:
            end = time.monotonic() + self._for_s
            step = 0
            while time.monotonic() < end and any(c is None for c in self.cut_after):
                for i, sock in enumerate(socks):
                    if self.cut_after[i] is not None:
                        continue
                    if closed_by_server(sock, 0.0) or not _sent(sock, TRICKLE[step : step + 1]):
                        self.cut_after[i] = time.monotonic() - opened[i]
                step += 1
                time.sleep(self._every_s)
        finally:
            for sock in socks:
                sock.close()


def _sent(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


def probe_while(trickler: Trickler, path: str = "/healthz") -> list[tuple[int | str, float]]:
    """Probe ``path`` every 0.1 s while the trickler runs: (status or error, seconds) each."""
    results: list[tuple[int | str, float]] = []
    while trickler.thread.is_alive() and len(results) < 200:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{trickler._port}{path}", timeout=3) as resp:
                resp.read()
                results.append((resp.status, time.monotonic() - started))
        except (OSError, urllib.error.URLError) as exc:
            results.append((type(exc).__name__, time.monotonic() - started))
        time.sleep(0.1)
    return results


@pytest.fixture
def slow_port() -> Iterator[int]:
    """An endpoint with the default connection bound and a 2 s request deadline."""
    endpoints = Endpoints(CollectorRegistry(), lambda: (True, "alive"), lambda: (True, "ready"), request_timeout_s=2.0)
    yield endpoints.serve("127.0.0.1", 0)
    endpoints.close()


def test_trickling_clients_neither_hold_a_connection_past_its_deadline_nor_keep_probes_out(slow_port: int) -> None:
    trickler = Trickler(slow_port, clients=16, every_s=0.3, for_s=4.0)
    trickler.thread.start()
    time.sleep(0.2)  # the slow clients are connected before the first probe
    results = probe_while(trickler)
    trickler.thread.join(10)
    assert len(results) >= 10
    failed = [r for r in results if r[0] != 200 or r[1] >= 1.0]
    assert not failed, f"{len(failed)} of {len(results)} probes failed or were slow: {failed[:5]}"
    # Every slow request was cut at its 2 s deadline, though a byte came every 0.3 s.
    assert all(c is not None and 1.8 <= c < 3.0 for c in trickler.cut_after), trickler.cut_after


def test_more_trickling_clients_than_the_bound_do_not_keep_probes_out() -> None:
    endpoints = Endpoints(
        CollectorRegistry(), lambda: (True, "alive"), lambda: (True, "ready"), request_timeout_s=2.0, max_connections=8
    )
    port = endpoints.serve("127.0.0.1", 0)
    try:
        trickler = Trickler(port, clients=40, every_s=0.3, for_s=4.0)
        trickler.thread.start()
        time.sleep(0.2)
        results = probe_while(trickler, "/readyz")
        trickler.thread.join(10)
    finally:
        endpoints.close()
    assert len(results) >= 10
    failed = [r for r in results if r[0] != 200 or r[1] >= 1.0]
    assert not failed, f"{len(failed)} of {len(results)} probes failed or were slow: {failed[:5]}"


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_requests_it_does_not_serve_get_a_status_and_a_close(port: int) -> None:
    assert raw_request(port, b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw_request(port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_request(port, b"GET /nope HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    too_large = b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"a" * 9000 + b"\r\n\r\n"
    assert raw_request(port, too_large).startswith(b"HTTP/1.1 431 ")
    head = raw_request(port, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # no body


# -- a flood of new connections: a probe whose request is in is never the one closed ---------

PROBE = b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n"


class Gate(Collector):
    """A collector that holds the server's one thread in ``/metrics`` until released, as when
    the thread does not get the CPU: meanwhile new connections wait in the listen backlog."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.release.wait(10)
        return iter(())


def read_response(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (b"" when it closed without a word)."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


@pytest.mark.parametrize("probe", ["accepted_with_the_flood", "accepted_before_the_flood"])
def test_a_flood_of_new_connections_does_not_close_a_probe_whose_request_is_in(probe: str) -> None:
    """64 connections (twice the bound) arrive in one loop turn. ``accepted_with_the_flood``: the
    probe connected and sent its request just before them; ``accepted_before_the_flood``: the
    probe was accepted a turn earlier and its request arrives right after them. Either way its
    request is in when the flood is accepted, so the probe is answered, not closed."""
    gate = Gate()
    registry = CollectorRegistry()
    registry.register(gate)
    endpoints = Endpoints(registry, lambda: (True, "alive"), lambda: (True, "ready"))
    port = endpoints.serve("127.0.0.1", 0)
    socks: list[socket.socket] = []

    def connect() -> socket.socket:
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        return socks[-1]

    try:
        early = connect() if probe == "accepted_before_the_flood" else None
        scrape = connect()
        scrape.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert gate.entered.wait(5)  # the server's thread is held; the early probe was accepted before
        late = None
        if early is None:
            late = connect()
            late.sendall(PROBE)
        flood = [connect() for _ in range(64)]
        if early is not None:
            early.sendall(PROBE)
        gate.release.set()
        started = time.monotonic()
        answer = read_response(early or late or scrape, 3.0)
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"alive\n"), answer
        assert took < 1.0, took
        assert read_response(scrape, 3.0).startswith(b"HTTP/1.1 200 ")
        # The flood was held to the bound: the oldest of its silent connections were closed.
        wait_until(lambda: sum(closed_by_server(sock, 0.0) for sock in flood) >= 64 - MAX_CONNECTIONS, 2.0, "evictions")
    finally:
        gate.release.set()
        for sock in socks:
            sock.close()
        endpoints.close()
