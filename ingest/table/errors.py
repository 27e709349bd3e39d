"""Errors of the Iceberg tables, under the project's one root (each is one line, exit 1 unless it says)."""

from __future__ import annotations

from ingest_common.errors import ExitCode, IngestError
from metastore.tables import TableNotEnabled

__all__ = [
    "CatalogUnavailable",
    "CommitConflicts",
    "FileSpansPartitions",
    "QueryFailed",
    "SchemaChangeRefused",
    "TableDiverged",
    "TableError",
    "TableNotEnabled",
]


class TableError(IngestError):
    """Base class of the table committer's own errors."""


class CommitConflicts(TableError):
    """Every attempt of one commit found the table changed meanwhile (another committer, a
    zombie, table maintenance). Nothing was appended; the committer's loop tries again at its
    next pass (``--once`` exits 1)."""


class TableDiverged(TableError):
    """The table's last commit and the metastore's record of it disagree by more than the one
    commit a crash can leave unrecorded: the table was changed by something else (restored,
    re-created). The committer appends nothing until an operator looks."""


class SchemaChangeRefused(TableError):
    """A spec version changed a column in a way Iceberg refuses (e.g. long -> string). The
    committer stops rather than skip the segments built with it."""


class FileSpansPartitions(TableError):
    """A data file holds event times of several partitions of the table's transform: a file is
    registered as written (never rewritten), so it cannot be appended to that table."""


class CatalogUnavailable(TableError):
    """The Iceberg catalog the spec's ``[table]`` names did not answer when it was opened (or
    refused the credentials it was given): one line naming it, exit 11."""

    exit_code = ExitCode.CATALOG_UNAVAILABLE


class QueryFailed(TableError):
    """``ingest query``: DuckDB refused the SQL (a syntax error, an unknown column)."""

    exit_code = ExitCode.INVALID_INPUT


class MergeFailed(TableError):
    """An upsert table's Spark merge failed (a segment file unreadable, the store or the catalog
    unreachable from Spark, Iceberg refusing a concurrent commit): nothing was swapped in, and
    the next pass merges again from the offsets the table and the metastore agree on."""
