"""The worker's HTTP endpoints on its metrics port: ``/metrics`` (Prometheus), ``/healthz``
(the loop is alive) and ``/readyz`` (assigned and consuming, or idle by design).

A scraper or probe that connects and says nothing cannot hold a thread for long (a read
timeout closes it), and no number of clients can make the worker start more than a bounded
number of threads (connections past the bound are closed at once; Prometheus and the
kubelet retry at their next interval)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ingest.errors import ConfigError
from ingest_common.redact import redact

Check = Callable[[], tuple[bool, str]]
# Seconds a connection may stay silent, and connections served at once.
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 8


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class Endpoints:
    def __init__(
        self,
        registry: CollectorRegistry,
        healthy: Check,
        ready: Check,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._max_connections = max_connections
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthy),
            "/readyz": lambda: _probe(ready),
        }

        class Handler(BaseHTTPRequestHandler):
            timeout = read_timeout_s  # applied to the connection's socket before any read

            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # scrapes are not events
                return

        self._handler = Handler
        self._server: _BoundedServer | None = None

    def serve(self, host: str, port: int) -> int:
        """Start serving in a daemon thread; returns the bound port (0 picks a free one)."""
        try:
            self._server = _BoundedServer((host, port), self._handler, self._max_connections)
        except OSError as exc:
            raise ConfigError(
                f"metrics endpoint {host}:{port}: {exc.strerror or exc} (INGEST_METRICS_HOST / INGEST_METRICS_PORT)"
            ) from exc
        threading.Thread(target=self._server.serve_forever, name="ingest-http", daemon=True).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _probe(check: Check) -> tuple[int, str, bytes]:
    ok, reason = check()
    # Like every text that leaves the process (ingest_common.redact): a reason may quote an error.
    return (200 if ok else 503), "text/plain; charset=utf-8", (redact(reason) + "\n").encode()
