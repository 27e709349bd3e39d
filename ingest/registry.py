"""The worker's entry in the metastore's registry (heartbeat, state, partitions) and its
error reports. Best effort: a metastore outage must never stop the loop."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Protocol

import structlog

from ingest import __version__
from metastore.errors import MetastoreError

log = structlog.get_logger(__name__)

HEARTBEAT_INTERVAL_S = 2.0


class RegistryStore(Protocol):
    def heartbeat(self, source: str, worker: str, host: str, pid: int, version: str, state: str,
                  partitions: Sequence[str]) -> None: ...
    def record_error(self, source: str, worker: str, kind: str, message: str) -> None: ...
    def control(self, source: str) -> tuple[str, bool]: ...


class WorkerRegistry:
    def __init__(self, store: RegistryStore, source: str, worker_id: str) -> None:
        self._store = store
        self._source = source
        self._worker_id = worker_id
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._due = 0.0
        # What operators asked for, as of the last heartbeat that reached the metastore.
        self.desired_state = "running"
        self.drain_stay = False

    def beat(self, state: str, partitions: Sequence[str], *, force: bool = False) -> None:
        """Heartbeat (at most every HEARTBEAT_INTERVAL_S unless forced) and read the controls."""
        now = time.monotonic()
        if not force and now < self._due:
            return
        self._due = now + HEARTBEAT_INTERVAL_S
        try:
            self._store.heartbeat(self._source, self._worker_id, self._host, self._pid, __version__, state,
                                  partitions)
            desired, stay = self._store.control(self._source)
        except MetastoreError as exc:
            log.warning("heartbeat_failed", source=self._source, worker=self._worker_id, error=str(exc))
            return
        if (desired, stay) != (self.desired_state, self.drain_stay):
            log.info("control_changed", source=self._source, worker=self._worker_id, desired_state=desired,
                     drain_stay=stay, previous=self.desired_state)
        self.desired_state, self.drain_stay = desired, stay

    def error(self, kind: str, message: str) -> None:
        try:
            self._store.record_error(self._source, self._worker_id, kind, message)
        except MetastoreError as exc:
            log.warning("error_report_failed", source=self._source, worker=self._worker_id, kind=kind,
                        error=str(exc))
