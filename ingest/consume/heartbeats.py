"""The worker's entry in the metastore's registry (heartbeat, state, partitions), the controls
operators set (read with every heartbeat), and its error reports.

Best effort, and never on the polling thread: the calls run on the background thread
(ingest.consume.background); a metastore outage delays them and never stops the loop.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

import structlog

from ingest import __version__
from ingest.consume.context import LoopContext, RegistryStore
from ingest_common.model import DesiredState, SourceControl, WorkerState

log = structlog.get_logger(__name__)

HEARTBEAT_INTERVAL_S = 2.0


class WorkerRegistry:
    def __init__(
        self, ctx: LoopContext, *, changed: threading.Event | None = None, interval_s: float | None = None
    ) -> None:
        self._ctx = ctx
        self._store: RegistryStore = ctx.store
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._background = ctx.background
        self._clock = ctx.clock
        # The spec version this worker builds with (reported in the registry).
        self._specs = ctx.specs
        self._host = socket.gethostname()
        self._pid = os.getpid()
        # This process's start, reported with every beat (the worker id may be a previous process's).
        self._started_at = datetime.now(UTC)
        self._due = 0.0
        self._in_flight = False
        # Read at construction (not as a default argument) so tests can lengthen the poll.
        self._interval_s = HEARTBEAT_INTERVAL_S if interval_s is None else interval_s
        # Set by the LISTEN thread when the source's controls changed: beat at once.
        self._changed = changed
        # A heartbeat that fails is counted and logged like every metastore call; the next
        # beat tries again.
        self._beat_failed = ctx.on_failure("heartbeat_failed", release=self._beat_ended)
        # What operators asked for, as of the last heartbeat that reached the metastore.
        self.control: SourceControl | None = None

    @property
    def desired_state(self) -> DesiredState:
        return self.control.desired_state if self.control is not None else DesiredState.RUNNING

    @property
    def drain_stay(self) -> bool:
        return self.control.drain_stay if self.control is not None else False

    def beat(
        self,
        state: WorkerState,
        partitions: Sequence[str],
        *,
        force: bool = False,
        registry_waiting: Sequence[str] = (),
        registry_error: str | None = None,
    ) -> None:
        """Heartbeat (at most every interval unless forced or notified) and read the controls,
        in the background; the controls read apply in a later ``Background.apply_done``.
        One heartbeat at a time: a slow metastore delays the next, it never queues them.
        ``registry_waiting``: the partitions paused while the schema registry does not answer,
        ``registry_error`` its last error (``ingest status`` shows them)."""
        now = self._clock.monotonic()
        notified = self._changed is not None and self._changed.is_set()
        if self._in_flight or (not force and not notified and now < self._due):
            return
        self._due = now + self._interval_s
        if self._changed is not None:
            # Cleared before the read: a change committed after it sets the flag again.
            self._changed.clear()
        self._in_flight = True
        snapshot = (str(state), list(partitions), self._specs.version)
        waiting = (list(registry_waiting), registry_error if registry_waiting else None)

        def call() -> SourceControl:
            self._store.heartbeat(
                self._source,
                self._worker_id,
                self._host,
                self._pid,
                __version__,
                snapshot[0],
                snapshot[1],
                snapshot[2],
                started_at=self._started_at,
                registry_waiting=waiting[0],
                registry_error=waiting[1],
            )
            return self._store.control(self._source)

        self._background.submit(call, lambda control: self._controls_read(control, notified), self._beat_failed)

    def _beat_ended(self) -> None:
        self._in_flight = False

    def _controls_read(self, control: SourceControl, notified: bool) -> None:
        self._in_flight = False
        previous = self.control
        if previous is None or control != previous:
            log.info(
                "control_changed",
                source=self._source,
                worker=self._worker_id,
                desired_state=control.desired_state,
                drain_stay=control.drain_stay,
                reset_generation=control.reset_generation,
                spec_version=control.spec_version,
                previous=previous.desired_state if previous else None,
                notified=notified,
            )
        self.control = control
        self._ctx.metrics.set_audit(control.last_audit)

    def error(self, kind: str, message: str) -> None:
        """Report an error (``ingest status`` lists the recent ones), in the background."""
        self._background.submit(
            lambda: self._store.record_error(self._source, self._worker_id, kind, message),
            None,
            self._ctx.on_failure("error_report_failed", kind=kind),
        )
