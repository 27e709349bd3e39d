"""Whether the build stage makes progress. Every build has a deadline (ingest.builder.job:
past it the job is interrupted and the build fails, and is retried); a batch still building
well past it means the interrupt did not take: a wedged Spark JVM, a Connect server with no
executors, a bug holding a build thread. The worker's /healthz then answers 503 with the
reason, so that an orchestrator restarts it; the stall is logged once when it passes the
bound and once when it ends.
"""

from __future__ import annotations

from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Building(Protocol):
    def longest_build_s(self) -> float: ...


class BuildWatch:
    def __init__(self, builds: Building, *, source: str, worker_id: str, bound_s: float) -> None:
        self._builds = builds
        self._source = source
        self._worker_id = worker_id
        self._bound_s = bound_s
        self._logged = False

    @property
    def stalled_reason(self) -> str | None:
        """Why the worker is unhealthy, or None. Safe from any thread."""
        running = self._builds.longest_build_s()
        if running < self._bound_s:
            return None
        return (
            f"a build has been running for {running:.0f}s (bound {self._bound_s:g}s) and its deadline's"
            " interrupt did not end it: the Spark session does not answer"
        )

    def check(self) -> None:
        """Log a stall when it passes the bound and when it ends (the loop calls this each step)."""
        reason = self.stalled_reason
        if reason is not None and not self._logged:
            self._logged = True
            log.error("build_stalled", source=self._source, worker=self._worker_id, reason=reason)
        elif reason is None and self._logged:
            self._logged = False
            log.info("build_stall_ended", source=self._source, worker=self._worker_id)
