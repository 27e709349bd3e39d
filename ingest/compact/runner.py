"""The long-running compactor role (``ingest compact SOURCE --every S``): one active compactor
per source (an advisory lock on a connection of its own), the others standing by; a pass
every ``every_s``; every failure it can ride out (the metastore or the store unreachable, a
Spark job that failed) retried with a capped backoff, never the end of the role.

Correctness never rests on the lock: a replacement of segments that are no longer current is
refused by the metastore (migrations/0017), and a compaction that dies leaves nothing visible.
The lock only keeps standbys from rewriting the same segments for nothing.
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog

from ingest.compact.job import CompactionResult, Compactor, spark_failure
from ingest.compact.metrics import CompactionMetrics, CompactorHealth
from ingest.errors import BuildError
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line
from metastore.errors import MetastoreUnavailable

log = structlog.get_logger(__name__)

STANDBY_POLL_S = 2.0
# After a failed pass: 1, 2, 4, ... 60 s (waited on the stop event), back to 1 after a good one.
PASS_RETRY = Backoff(1.0, 60.0)


class CompactorLock(Protocol):
    def try_compact_lock(self, source: str) -> bool: ...

    def release_compact_lock(self) -> None: ...


def _retried(exc: Exception) -> bool:
    """What the next pass may get past: outages, and a Spark job that failed (its files are gc's)."""
    return isinstance(exc, MetastoreUnavailable | OSError | BuildError) or spark_failure(exc)


def run_compactor(
    compactor: Compactor,
    lock: CompactorLock,
    source: str,
    every_s: float,
    stop: threading.Event,
    target_bytes: int | None = None,
    metrics: CompactionMetrics | None = None,
    health: CompactorHealth | None = None,
) -> list[CompactionResult]:
    """Compact ``source`` every ``every_s`` while holding its lock, until ``stop`` is set.
    Returns the passes' results (for tests and the command's summary). ``metrics``, ``health``:
    what the role's endpoints serve (the store's shape is read after every pass, a standby's too)."""
    metrics = metrics or CompactionMetrics(source)
    health = health or CompactorHealth()
    results: list[CompactionResult] = []
    active = standby_logged = False
    failures = 0
    reason = "stop requested"
    try:
        while not stop.is_set():
            try:
                if not lock.try_compact_lock(source):
                    if not standby_logged:
                        log.info("compactor_standby", source=source)
                        standby_logged = True
                    active = False
                    metrics.active.labels(source).set(0)
                    metrics.shape(*compactor.survey(source, target_bytes))
                    health.passed(active=False)
                    stop.wait(max(every_s, STANDBY_POLL_S))
                    continue
                if not active:
                    log.info("compactor_active", source=source)
                active, standby_logged = True, False
                metrics.active.labels(source).set(1)
                health.holding(active=True)
                result = compactor.run(source, target_bytes)
                results.append(result)
                metrics.passed(result)
                metrics.shape(*compactor.survey(source, target_bytes))
                health.passed(active=True)
                log.info(
                    "compaction_pass",
                    source=source,
                    chunks=len(result.chosen),
                    replaced=len(result.replaced),
                    refused=len(result.refused),
                )
                failures = 0
                stop.wait(every_s)
            except Exception as exc:
                if not _retried(exc):
                    raise
                metrics.failures.labels(source).inc()
                health.failed(first_line(exc))
                delay = PASS_RETRY.delay(failures)
                failures += 1
                log.warning("compaction_retry", source=source, error=first_line(exc), retry_in_s=delay)
                stop.wait(delay)
    except BaseException as exc:
        reason = first_line(exc)
        raise
    finally:
        health.stopped(reason)
        metrics.active.labels(source).set(0)
        lock.release_compact_lock()
    return results
