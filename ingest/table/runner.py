"""The long-running table committer role: one active committer per source (the advisory lock),
the others standing by, as a role of ingest.roles.runner: every failure it can ride out is
retried with a capped backoff and reported through its health, never the end of the role; a
pass that goes past its deadline (INGEST_TABLE_PASS_DEADLINE_S without a commit attempt
ending) has its lock released so that a standby takes over.

Correctness never rests on the lock (ingest.table.committer appends a batch only onto the
table state it was chosen from, and records it inside its catalog swap behind a fence); the
lock only keeps standbys from wasting commits. So a pass past its deadline needs no stopping:
the lock released is enough, and whatever that pass still commits is fenced like any other.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ingest.roles.runner import run_singleton_role
from metastore.tables import TableKind

if TYPE_CHECKING:
    import threading

    from ingest.table.committer import TableCommitter

from ingest.table.role import RETRIED, pacing


class CommitterRole:
    """The table committer as a singleton role (ingest.roles.runner.SingletonRole)."""

    def __init__(self, committer: TableCommitter) -> None:
        self._committer = committer
        self._source = committer.source
        self.health = committer.health
        self.pacing = pacing(committer.settings)

    def try_lock(self) -> bool:
        return self._committer.store.try_lock(self._source)

    def release_lock(self) -> None:
        self._committer.store.unlock()

    def holding(self, active: bool) -> None:
        self._committer.metrics.committer_active.labels(self._source).set(int(active))

    def active_pass(self) -> None:
        for kind in self._committer.kinds():
            if self._due(kind):
                self._committer.commit_pending(kind)

    def standby_pass(self) -> None:
        # A standby reports how far behind the table is too: alerts take the maximum over
        # every committer, so none may keep a value from when it was active.
        for kind in self._committer.kinds():
            self._committer.update_behind(kind)

    def interrupt(self) -> None:
        """Nothing to stop: the lock released is enough (a late commit is fenced)."""

    def retried(self, exc: Exception) -> bool:
        # Nothing was recorded that the next pass's reconcile does not settle.
        return isinstance(exc, RETRIED)

    def failed(self) -> None:
        """Counted by the health only (the commit conflicts have their own counter)."""

    def _due(self, kind: TableKind) -> bool:
        committer = self._committer
        behind, _oldest = committer.update_behind(kind)
        if behind == 0:
            return False
        if behind >= committer.settings.batch_segments:
            return True
        return time.monotonic() - committer.last_commit_at(kind) >= committer.settings.interval_s


def run_committer(committer: TableCommitter, stop: threading.Event) -> None:
    """Commit until ``stop`` is set; an error it does not retry (a diverged table, a refused
    schema change) ends it, and its health says why."""
    run_singleton_role(CommitterRole(committer), stop)
