"""The worker's HTTP endpoints on its metrics port: ``/metrics`` (Prometheus), ``/healthz``
(the loop is alive) and ``/readyz`` (assigned and consuming, or idle by design).

One thread serves every connection over non-blocking sockets, one request per connection.
What keeps the probes answering whatever other clients do (a scraper gone wrong, or anything
in the cluster that can reach the port, trickling bytes):

- Each connection has one deadline, counted from its accept: its whole request head must
  arrive, and its response leave, within ``request_timeout_s``; then it is closed however the
  bytes trickle in (a per-read timeout would start again with every byte).
- At most ``max_connections`` are open. A connection past the bound closes the oldest one
  whose request has not fully arrived rather than being refused, so no number of slow or
  silent clients keeps a new one out. A request that has fully arrived is never the one
  closed: before a connection is given up, what it has received is read, and a complete
  request is answered instead. So a probe (its request comes in one packet right after its
  connect) is answered however many connections arrive with it or after it, even when the
  thread was held up while they queued; it is closed unanswered only if ``max_connections``
  newer connections arrive before its request does.
- A request head is at most ``MAX_HEAD_BYTES``; the routes only read in-memory state.
- No thread per connection: the number of clients never changes the number of threads.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ingest.errors import ConfigError
from ingest_common.redact import redact

log = structlog.get_logger(__name__)

Check = Callable[[], tuple[bool, str]]
Route = Callable[[], tuple[int, str, bytes]]
# Seconds from accept to the response sent, and connections open at once.
REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
MAX_HEAD_BYTES = 8192
# Connections accepted per loop turn: a flood of new connections cannot starve the reads.
_ACCEPTS_PER_TURN = 64
# Longest sleep of the loop: how soon close() and expired deadlines are noticed.
_TICK_S = 0.1


@dataclass(slots=True)
class _Connection:
    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    # None while the request head is being read; the bytes left to send once answered.
    response: bytearray | None = None


class _Server:
    """The accept-read-answer loop (see the module docstring for its invariants)."""

    def __init__(
        self, listener: socket.socket, routes: dict[str, Route], request_timeout_s: float, max_connections: int
    ) -> None:
        self._listener = listener
        self._routes = routes
        self._request_timeout_s = request_timeout_s
        self._max_connections = max_connections
        self._selector = selectors.DefaultSelector()
        # Insertion order is accept order: the first reading one is the oldest.
        self._connections: dict[socket.socket, _Connection] = {}
        self._stop = threading.Event()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _events in self._selector.select(self._wait()):
                    if key.data is None:
                        self._accept()
                    elif key.data.sock in self._connections:  # not closed earlier in this turn
                        self._serve(key.data)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._connections.values()):
                self._close(conn)
            self._selector.close()

    def stop(self) -> None:
        self._stop.set()

    def _wait(self) -> float:
        if not self._connections:
            return _TICK_S
        soonest = min(c.deadline for c in self._connections.values())
        return max(0.0, min(_TICK_S, soonest - time.monotonic()))

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the loop itself goes on
                log.warning("http_accept_failed", error=str(exc))
                return
            self._make_room()
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + self._request_timeout_s)
            self._connections[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> None:
        """Below ``max_connections`` for one more: the oldest connection still reading is read
        once more (a complete request is answered, and leaves or stops reading) and closed only
        if its request is still incomplete; answered ones are about to leave, so the oldest of
        all goes only when every connection is answered."""
        while len(self._connections) >= self._max_connections:
            oldest = next((c for c in self._connections.values() if c.response is None), None)
            if oldest is None:
                self._close(next(iter(self._connections.values())))
            else:
                self._serve(oldest)
                if oldest.response is None:
                    self._close(oldest)

    def _serve(self, conn: _Connection) -> None:
        try:
            if conn.response is None:
                self._read(conn)
            else:
                self._send(conn)
        except OSError:  # reset by the client, or the like: nothing to answer
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        """Everything received so far, until the request head ends (then it is answered)."""
        while True:
            try:
                data = conn.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                self._close(conn)
                return
            conn.received += data
            end = _head_end(conn.received)
            if end is not None or len(conn.received) > MAX_HEAD_BYTES:
                break
        if end is None or end > MAX_HEAD_BYTES:
            response = _response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "text/plain", b"request too large\n")
        else:
            response = self._answer(bytes(conn.received[:end]))
        conn.response = bytearray(response)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._send(conn)

    def _answer(self, head: bytes) -> bytes:
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response(HTTPStatus.BAD_REQUEST, "text/plain", b"bad request\n")
        method, target = parts[0], parts[1].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            return _response(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"GET only\n", allow="GET, HEAD")
        route = self._routes.get(target.split("?", 1)[0])
        try:
            status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
        except Exception as exc:  # a failing collector or check: answered, the loop goes on
            log.exception("http_route_failed", path=target.split("?", 1)[0], error=str(exc))
            status, ctype, body = 500, "text/plain", b"internal error\n"
        return _response(HTTPStatus(status), ctype, body, head_only=method == b"HEAD")

    def _send(self, conn: _Connection) -> None:
        assert conn.response is not None
        try:
            sent = conn.sock.send(conn.response)
        except (BlockingIOError, InterruptedError):
            return
        del conn.response[:sent]
        if not conn.response:
            self._close(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._connections.pop(conn.sock, None) is None:
            return
        self._selector.unregister(conn.sock)
        conn.sock.close()


def _head_end(received: bytearray) -> int | None:
    """Where the request head ends (after its blank line), or None while it has not."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        index = received.find(separator)
        if index >= 0:
            return index + len(separator)
    return None


def _response(status: HTTPStatus, ctype: str, body: bytes, *, head_only: bool = False, allow: str = "") -> bytes:
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {ctype}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if allow:
        lines.append(f"Allow: {allow}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


class Endpoints:
    def __init__(
        self,
        registry: CollectorRegistry,
        healthy: Check,
        ready: Check,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._request_timeout_s = request_timeout_s
        self._max_connections = max_connections
        self._routes: dict[str, Route] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthy),
            "/readyz": lambda: _probe(ready),
        }
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Start serving in a daemon thread; returns the bound port (0 picks a free one)."""
        try:
            listener = socket.create_server((host, port), backlog=128)
        except OSError as exc:
            raise ConfigError(
                f"metrics endpoint {host}:{port}: {exc.strerror or exc} (INGEST_METRICS_HOST / INGEST_METRICS_PORT)"
            ) from exc
        bound = int(listener.getsockname()[1])
        self._server = _Server(listener, self._routes, self._request_timeout_s, self._max_connections)
        self._thread = threading.Thread(
            target=self._run, args=(self._server, listener), name="ingest-http", daemon=True
        )
        self._thread.start()
        return bound

    @staticmethod
    def _run(server: _Server, listener: socket.socket) -> None:
        try:
            server.run()
        finally:
            listener.close()

    def close(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.stop()
            self._thread.join(5.0)
            self._server = None
            self._thread = None


def _probe(check: Check) -> tuple[int, str, bytes]:
    ok, reason = check()
    # Like every text that leaves the process (ingest_common.redact): a reason may quote an error.
    return (200 if ok else 503), "text/plain; charset=utf-8", (redact(reason) + "\n").encode()
