"""The metastore's exception hierarchy. psycopg errors never leave this package untranslated."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ingest_common.errors import ExitCode, IngestError
from ingest_common.model import TopicPartition


@dataclass(frozen=True, slots=True)
class Session:
    """A connection's session on the server: its backend's pid and start (a pid is reused)."""

    pid: int
    started: datetime


class MetastoreError(IngestError):
    """Base class of every error the metastore raises."""


class MetastoreUnavailable(MetastoreError):
    """PostgreSQL cannot be reached or the connection broke. Retrying later may work."""

    exit_code = ExitCode.METASTORE_UNAVAILABLE


class CommitOutcomeUnknown(MetastoreUnavailable):
    """The connection broke, or was given up for want of a reply, while a transaction was in
    flight: it may or may not have committed, and may still commit while its ``session``
    lives. Resolve by ending the session (``Metastore.end_session``), then looking the split
    up (``Metastore.segment_for_split``). A retry of a split whose publish did commit is
    answered with its segment (the publish is idempotent by split id)."""

    def __init__(self, message: str, session: Session | None = None) -> None:
        super().__init__(message)
        self.session = session


class SchemaMissing(MetastoreError):
    """The metastore's tables do not exist: run ``ingest migrate``."""

    exit_code = ExitCode.SCHEMA_NOT_CURRENT


class SourceNotFound(MetastoreError):
    exit_code = ExitCode.UNKNOWN_SOURCE

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown source {name!r}: apply its spec first with `ingest source apply FILE`")
        self.name = name


class MigrationLocked(MetastoreError):
    """Another migration run holds yoyo's lock row, or a dead one left it behind."""


class PublishConflict(MetastoreError):
    """The publish check failed: this worker no longer owns the partition (``serial``),
    the split does not start at the stored next offset (``offset``), the partition row
    is gone (``missing``), gc gave the split up (``abandoned``) or no build registered it
    (``unregistered``). Nothing of the segment was written; the conflict is recorded."""

    def __init__(self, reason: str, tp: TopicPartition, expected: int | None, actual: int | None) -> None:
        if reason in ("abandoned", "unregistered"):
            message = (
                f"publish rejected for {tp}: the split was {reason} (gc gave it up after the grace period, "
                "or no build registered it); its records are read again"
            )
        else:
            message = f"publish rejected for {tp}: {reason} mismatch (expected {expected}, stored {actual})"
        super().__init__(message)
        self.reason = reason
        self.tp = tp
        self.expected = expected
        self.actual = actual


class SourceTerminated(MetastoreError):
    """The source was terminated (``ingest terminate``): no worker runs it and no control
    applies until it is re-activated with ``ingest source apply FILE --reactivate``."""

    exit_code = ExitCode.SOURCE_TERMINATED

    def __init__(self, name: str, state: str = "terminated") -> None:
        what = "is terminated" if state == "terminated" else "is being terminated (`ingest terminate` in progress)"
        super().__init__(f"source {name!r} {what}: re-activate it with `ingest source apply FILE --reactivate`")
        self.name = name


class StoreOverlap(MetastoreError):
    """A source's files would lie inside another source's (or the other way round)."""

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, name: str, root: str, other: str, other_root: str) -> None:
        super().__init__(
            f"segment_store: source {name!r} would write under {root}, which overlaps {other_root} "
            f"of source {other!r}; give each source a store of its own"
        )
        self.name = name
        self.other = other


class GroupTaken(MetastoreError):
    """Two sources in one consumer group would split its partitions between them."""

    exit_code = ExitCode.INVALID_INPUT

    def __init__(self, name: str, group: str, other: str) -> None:
        super().__init__(
            f"consumer_group: {group!r} is already the consumer group of source {other!r}; "
            f"source {name!r} needs a group of its own"
        )
        self.name = name
        self.group = group
        self.other = other


class InvalidReset(MetastoreError):
    """An ``ingest reset`` named partitions the source does not have, or negative offsets."""

    exit_code = ExitCode.INVALID_INPUT


class ReplaceRefused(MetastoreError):
    """A segment replacement (compaction, migrations/0017) wrote nothing: an old segment is no
    longer current (``replaced``: another compactor was first) or not the source's
    (``missing``), the source feeds an Iceberg table (``table``), the old segments differ in
    spec version (``spec_version``), their ranges are not contiguous per partition
    (``ranges``), the new files' row count differs (``row_count``), or gc gave the
    compaction's split up (``abandoned``; ``unregistered``: no build registered it)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"segment replacement refused ({reason}): {detail}")
        self.reason = reason
        self.detail = detail
