"""The worker's HTTP endpoints on its metrics port: ``/metrics`` (Prometheus), ``/healthz``
(the loop is alive) and ``/readyz`` (assigned and consuming, or idle by design)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ingest.errors import ConfigError

Check = Callable[[], tuple[bool, str]]


class Endpoints:
    def __init__(self, registry: CollectorRegistry, healthy: Check, ready: Check) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthy),
            "/readyz": lambda: _probe(ready),
        }

        class Handler(BaseHTTPRequestHandler):
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
        self._server: ThreadingHTTPServer | None = None

    def serve(self, host: str, port: int) -> int:
        """Start serving in a daemon thread; returns the bound port (0 picks a free one)."""
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler)
        except OSError as exc:
            raise ConfigError(f"metrics endpoint {host}:{port}: {exc.strerror or exc}"
                              " (INGEST_METRICS_HOST / INGEST_METRICS_PORT)") from exc
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="ingest-http", daemon=True).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _probe(check: Check) -> tuple[int, str, bytes]:
    ok, reason = check()
    return (200 if ok else 503), "text/plain; charset=utf-8", (reason + "\n").encode()
