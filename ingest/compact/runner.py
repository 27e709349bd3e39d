"""The long-running compactor role (``ingest compact SOURCE --every S``): one active compactor
per source (an advisory lock on a connection of its own), the others standing by, as a role of
ingest.roles.runner; a pass every ``every_s``; every failure it can ride out (the metastore or
the store unreachable, a Spark job that failed) retried with a capped backoff, never the end of
the role. A pass that goes past its deadline (INGEST_COMPACT_PASS_DEADLINE_S without a chunk
ending: a Spark job that hangs) has its Spark job interrupted and its lock released, so that
a standby takes over.

Correctness never rests on the lock: a replacement of segments that are no longer current is
refused by the metastore (migrations/0017), and a compaction that dies leaves nothing visible.
The lock only keeps standbys from rewriting the same segments for nothing.
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog

from ingest.compact.job import CompactionResult, Compactor, spark_failure
from ingest.compact.metrics import CompactionMetrics
from ingest.config import COMPACT_PASS_DEADLINE_S
from ingest.errors import BuildError
from ingest.roles.health import RoleHealth, RoleNames
from ingest.roles.runner import RolePacing, run_singleton_role
from ingest_common.backoff import Backoff
from metastore.errors import MetastoreUnavailable

log = structlog.get_logger(__name__)

# After a failed pass: 1, 2, 4, ... 60 s, back to 1 after a good one.
PASS_RETRY = Backoff(1.0, 60.0)
# Every pass failing for this long makes /healthz answer 503: a metastore or store outage far
# past a restart or failover, a Spark that keeps failing.
UNHEALTHY_AFTER_S = 900.0
NAMES = RoleNames(
    noun="compactor",
    step="chunk",
    deadline_setting="INGEST_COMPACT_PASS_DEADLINE_S",
    standby_event="compactor_standby",
    active_event="compactor_active",
    retry_event="compaction_retry",
    unhealthy_event="compactor_unhealthy",
    healthy_event="compactor_healthy",
    past_deadline_event="compaction_past_deadline",
    interrupted_event="compaction_interrupted",
)


class CompactorLock(Protocol):
    def try_compact_lock(self, source: str) -> bool: ...

    def release_compact_lock(self) -> None: ...


def _retried(exc: Exception) -> bool:
    """What the next pass may get past: outages, and a Spark job that failed (its files are gc's)."""
    return isinstance(exc, MetastoreUnavailable | OSError | BuildError) or spark_failure(exc)


def compactor_health(
    source: str,
    every_s: float,
    pass_deadline_s: float = COMPACT_PASS_DEADLINE_S,
    unhealthy_after_s: float = UNHEALTHY_AFTER_S,
) -> RoleHealth:
    """What the role's /healthz and /readyz serve."""
    return RoleHealth(
        NAMES,
        source,
        unhealthy_after_s=unhealthy_after_s,
        idle_s=RolePacing(every_s, PASS_RETRY).idle_s,
        pass_deadline_s=pass_deadline_s,
    )


class CompactorRole:
    """The compactor as a singleton role (ingest.roles.runner.SingletonRole)."""

    def __init__(
        self,
        compactor: Compactor,
        lock: CompactorLock,
        source: str,
        every_s: float,
        target_bytes: int | None,
        metrics: CompactionMetrics,
        health: RoleHealth,
    ) -> None:
        self._compactor = compactor
        self._lock = lock
        self._source = source
        self._target = target_bytes
        self._metrics = metrics
        self.health = health
        self.pacing = RolePacing(every_s, PASS_RETRY)
        self.results: list[CompactionResult] = []

    def try_lock(self) -> bool:
        return self._lock.try_compact_lock(self._source)

    def release_lock(self) -> None:
        self._lock.release_compact_lock()

    def holding(self, active: bool) -> None:
        self._metrics.active.labels(self._source).set(int(active))

    def active_pass(self) -> None:
        result = self._compactor.run(self._source, self._target, progress=self.health.progressed)
        self.results.append(result)
        self._metrics.passed(result)
        self._metrics.shape(*self._compactor.survey(self._source, self._target))
        log.info(
            "compaction_pass",
            source=self._source,
            chunks=len(result.chosen),
            replaced=len(result.replaced),
            refused=len(result.refused),
        )

    def standby_pass(self) -> None:
        # The store's shape, read by standbys too: alerts take the maximum over every compactor.
        self._metrics.shape(*self._compactor.survey(self._source, self._target))

    def interrupt(self) -> None:
        self._compactor.interrupt()

    def retried(self, exc: Exception) -> bool:
        return _retried(exc)

    def failed(self) -> None:
        self._metrics.failures.labels(self._source).inc()


def run_compactor(
    compactor: Compactor,
    lock: CompactorLock,
    source: str,
    every_s: float,
    stop: threading.Event,
    target_bytes: int | None = None,
    metrics: CompactionMetrics | None = None,
    health: RoleHealth | None = None,
) -> list[CompactionResult]:
    """Compact ``source`` every ``every_s`` while holding its lock, until ``stop`` is set.
    Returns the passes' results (for tests and the command's summary). ``metrics``, ``health``:
    what the role's endpoints serve (the store's shape is read after every pass, a standby's too;
    ``health`` carries the pass deadline, see :func:`compactor_health`)."""
    role = CompactorRole(
        compactor,
        lock,
        source,
        every_s,
        target_bytes,
        metrics or CompactionMetrics(source),
        health or compactor_health(source, every_s),
    )
    run_singleton_role(role, stop)
    return role.results
