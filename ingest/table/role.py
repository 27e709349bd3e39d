"""The table committer as a singleton role: its pacing, the errors a pass may meet and the next
pass settles, its names in logs and health, and its health (ingest.roles). Apart from the role's
loop (ingest.table.runner), which runs a committer: the committer keeps its health, the loop
runs it."""

from __future__ import annotations

from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ServerError,
    ServiceUnavailableError,
)
from sqlalchemy.exc import SQLAlchemyError

from ingest.roles.health import RoleHealth, RoleNames
from ingest.roles.runner import RolePacing
from ingest.table.config import CommitSettings
from ingest.table.errors import CommitConflicts, MergeFailed
from ingest_common.backoff import Backoff
from metastore.errors import MetastoreUnavailable

# After a failed pass: 0.5, 1, 2, ... 10 s, back to 0.5 after a good one.
PASS_RETRY = Backoff(0.5, 10.0)
# What a pass may meet and the next pass's reconcile settles: PostgreSQL restarting, the store
# briefly unreachable, another committer's commits.
RETRIED = (
    MetastoreUnavailable,
    SQLAlchemyError,
    CommitStateUnknownException,
    CommitFailedException,
    CommitConflicts,
    # An upsert table's Spark merge: nothing swapped in; the next pass merges again.
    MergeFailed,
    OSError,
    # A REST catalog's 5xx: the next pass's reconcile settles what the commit did.
    ServerError,
    ServiceUnavailableError,
)
NAMES = RoleNames(
    noun="committer",
    step="commit attempt",
    deadline_setting="INGEST_TABLE_PASS_DEADLINE_S",
    standby_event="table_committer_standby",
    active_event="table_committer_active",
    retry_event="table_commit_retry",
    unhealthy_event="table_committer_unhealthy",
    healthy_event="table_committer_healthy",
    past_deadline_event="table_commit_past_deadline",
    interrupted_event="table_commit_interrupted",
)


def pacing(settings: CommitSettings) -> RolePacing:
    return RolePacing(settings.poll_s, PASS_RETRY)


def committer_health(source: str, settings: CommitSettings) -> RoleHealth:
    return RoleHealth(
        NAMES,
        source,
        unhealthy_after_s=settings.unhealthy_after_s,
        idle_s=pacing(settings).idle_s,
        pass_deadline_s=settings.pass_deadline_s,
    )
