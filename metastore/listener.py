"""LISTEN for control changes on a dedicated connection, so workers apply suspend / resume /
drain / terminate / reset / spec changes within a fraction of a second instead of at their
next heartbeat poll (which stays the fallback: a lost connection only costs latency)."""

from __future__ import annotations

import threading

import psycopg
import structlog

from ingest_common.backoff import Backoff
from metastore.connection import ConnectionLimits, connect, redact_url, wrap_exceptions
from metastore.errors import MetastoreError
from metastore.queries import query

log = structlog.get_logger(__name__)

# Reconnects after a lost LISTEN connection: 0.5, 1, 2, 5, then every 10 s.
RECONNECT_BACKOFF = Backoff.stepped(0.5, 1.0, 2.0, 5.0, 10.0)


class ControlListener:
    """A daemon thread that sets ``changed`` whenever the source's row changes (the
    ``ingest_sources_notify`` trigger sends NOTIFY ingest_control with the source's name).
    Also set after every (re)connect: notifications sent while disconnected are lost."""

    def __init__(
        self,
        url: str,
        source: str,
        *,
        wait_s: float = 0.5,
        limits: ConnectionLimits | None = None,
        backoff: Backoff = RECONNECT_BACKOFF,
    ) -> None:
        self._url = url
        self._backoff = backoff
        self._limits = limits
        self._source = source
        self._wait_s = wait_s
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ingest-listen-{source}", daemon=True)

    def start(self) -> ControlListener:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._listen()
                failures = 0
            except (MetastoreError, psycopg.Error) as exc:
                delay = self._backoff.delay(failures)
                failures += 1
                log.warning(
                    "control_listen_failed",
                    source=self._source,
                    url=redact_url(self._url),
                    error=str(exc),
                    retry_in_s=delay,
                )
                self._backoff.sleep_unless(delay, self._stop.is_set, poll_s=0.1)

    def _listen(self) -> None:
        conn = connect(self._url, self._limits)
        try:
            with wrap_exceptions(self._url):
                conn.execute(query("listen_controls"))
                self.changed.set()
                while not self._stop.is_set():
                    # Returns after wait_s without a notification, so the stop flag is seen.
                    for note in conn.notifies(timeout=self._wait_s):
                        if note.payload == self._source:
                            self.changed.set()
        finally:
            conn.close()
