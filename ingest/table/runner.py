"""The long-running table committer role: one active committer per source (the advisory lock),
the others standing by; every failure it can ride out is retried with a capped backoff and
reported through the committer's health, never the end of the role.

Correctness never rests on the lock (ingest.table.committer appends a batch only onto the
table state it was chosen from); the lock only keeps standbys from wasting commits.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import structlog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
)
from sqlalchemy.exc import SQLAlchemyError

from ingest.table.errors import CommitConflicts
from ingest.table.health import CommitterState
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line
from metastore.errors import MetastoreUnavailable
from metastore.tables import TableKind

if TYPE_CHECKING:
    from ingest.table.committer import TableCommitter

log = structlog.get_logger(__name__)

MAX_RETRY_DELAY_S = 10.0
STANDBY_POLL_S = 2.0
# After a failed pass: 0.5, 1, 2, ... 10 s (waited on the stop event), back to 0.5 after a good one.
PASS_RETRY = Backoff(0.5, MAX_RETRY_DELAY_S)
# What a pass may meet and the next pass's reconcile settles: PostgreSQL restarting, the store
# or a REST catalog briefly unreachable (requests' errors are OSErrors) or failing (5xx),
# another committer's commits.
RETRIED = (
    MetastoreUnavailable,
    SQLAlchemyError,
    CommitStateUnknownException,
    CommitFailedException,
    CommitConflicts,
    ServerError,
    ServiceUnavailableError,
    OSError,
)


def run_committer(committer: TableCommitter, stop: threading.Event) -> None:
    """Commit until ``stop`` is set; an error it does not retry (a diverged table, a refused
    schema change) ends it, and its health says why."""
    reason = "stop requested"
    try:
        _loop(committer, stop)
    except BaseException as exc:
        reason = first_line(exc)
        raise
    finally:
        committer.health.stopped(reason)
        committer.store.unlock()
        committer.metrics.committer_active.labels(committer.source).set(0)


def _due(committer: TableCommitter, kind: TableKind) -> bool:
    behind, _oldest = committer.update_behind(kind)
    if behind == 0:
        return False
    if behind >= committer.settings.batch_segments:
        return True
    return time.monotonic() - committer.last_commit_at(kind) >= committer.settings.interval_s


def _loop(committer: TableCommitter, stop: threading.Event) -> None:
    source, settings, metrics = committer.source, committer.settings, committer.metrics
    standby_logged = active = False
    failures = 0
    while not stop.is_set():
        try:
            if not committer.store.try_lock(source):
                active = False
                metrics.committer_active.labels(source).set(0)
                if not standby_logged:
                    log.info("table_committer_standby", source=source)
                    standby_logged = True
                # A standby reports how far behind the table is too: alerts take the maximum
                # over every committer, so none may keep a value from when it was active.
                for kind in committer.kinds():
                    committer.update_behind(kind)
                committer.health.passed(CommitterState.STANDBY)
                stop.wait(max(settings.poll_s, STANDBY_POLL_S))
                continue
            if not active:
                log.info("table_committer_active", source=source)
            standby_logged = False
            active = True
            metrics.committer_active.labels(source).set(1)
            for kind in committer.kinds():
                if _due(committer, kind):
                    committer.commit_pending(kind)
            committer.health.passed(CommitterState.ACTIVE)
            failures = 0
            stop.wait(settings.poll_s)
        except RETRIED as exc:
            # Nothing was recorded that the next pass's reconcile does not settle.
            active = False
            metrics.committer_active.labels(source).set(0)
            committer.health.failed(first_line(exc))
            delay = PASS_RETRY.delay(failures)
            failures += 1
            log.warning("table_commit_retry", source=source, error=first_line(exc), retry_in_s=delay)
            stop.wait(delay)
