"""Whether the publishing thread makes progress. A publish retries for as long as the metastore
does not take it (ingest.publish.publisher), and every wait in it is bounded (metastore.connection);
a publish still unfinished after ``bound_s`` means the metastore has not been usable from
this worker for that long (a black-holed path, a wedged server, a lock never released), or a
bug holds the thread. Either way the worker's /healthz answers 503 with the reason, so that
an orchestrator restarts it, and the stall is logged once when it passes the bound and once
when it ends.

Only /healthz says it, not the worker's registry state: the registry is written to the same
metastore, and a worker restart is what the probe is for.
"""

from __future__ import annotations

import time

import structlog

from ingest.publish.queue import PublishQueue
from ingest.publish.settle import PublishInProgress

log = structlog.get_logger(__name__)

# Default bound: longer than a few attempts that each wait their full statement timeout and
# grace (35 s by default), short enough that a worker whose publishes hang is restarted within minutes.
UNHEALTHY_AFTER_PUBLISH_STALL_S = 120.0


class PublishWatch:
    def __init__(
        self, publishes: PublishQueue, *, source: str, worker_id: str, bound_s: float = UNHEALTHY_AFTER_PUBLISH_STALL_S
    ) -> None:
        self._publishes = publishes
        self._source = source
        self._worker_id = worker_id
        self._bound_s = bound_s
        # The stalled publish last logged (None: none is stalled, as far as the log says).
        self._logged: PublishInProgress | None = None

    @property
    def stalled_reason(self) -> str | None:
        """Why the worker is unhealthy, or None. Safe from any thread."""
        return self._reason(self._publishes.publishing)

    def _reason(self, current: PublishInProgress | None) -> str | None:
        if current is None:
            return None
        waited = time.monotonic() - current.since
        if waited < self._bound_s:
            return None
        split = current.split
        return (
            f"publish of {split.tp} [{split.start}, {split.end}) unfinished after {waited:.0f}s "
            f"(bound {self._bound_s:g}s): the metastore does not answer or does not take it"
        )

    def check(self) -> None:
        """Log a stall when it passes the bound and when it ends (the loop calls this each step)."""
        current = self._publishes.publishing
        if self._logged is not None and current is not self._logged:
            log.info(
                "publish_stall_ended",
                source=self._source,
                worker=self._worker_id,
                split=str(self._logged.split.id),
                seconds=round(time.monotonic() - self._logged.since, 1),
            )
            self._logged = None
        if current is not None and current is not self._logged and (reason := self._reason(current)) is not None:
            self._logged = current
            log.error(
                "publish_stalled",
                source=self._source,
                worker=self._worker_id,
                split=str(current.split.id),
                topic=current.split.tp.topic,
                partition=current.split.tp.partition,
                bound_s=self._bound_s,
                reason=reason,
            )
