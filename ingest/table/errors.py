"""Errors of the Iceberg tables, under the project's one root (each is one line, exit 1 unless it says)."""

from __future__ import annotations

from ingest_common.errors import ExitCode, IngestError, first_line
from metastore.tables import TableNotEnabled

__all__ = [
    "CatalogUnavailable",
    "CommitConflicts",
    "FileSpansPartitions",
    "QueryFailed",
    "SchemaChangeRefused",
    "SegmentsRefused",
    "TableDiverged",
    "TableError",
    "TableNotEnabled",
    "file_refused",
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


class SegmentsRefused(TableError):
    """The table cannot take a file of these segments, whatever the servers do: a value its
    column statistics cannot hold (a string that is not UTF-8, a timestamp outside years
    1-9999), a file that does not read as Parquet. Nothing was appended. The committer finds
    the segment among them, keeps it pending and reported (``ingest status``, ``ingest table``,
    ``ingest audit``, /healthz), appends the others and tries it again on a backoff."""

    def __init__(self, message: str, segment_ids: tuple[int, ...]) -> None:
        super().__init__(message)
        self.segment_ids = segment_ids


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


def file_refused(name: str, ids: tuple[int, ...], exc: ValueError | ArithmeticError) -> TableError:
    """What pyiceberg's refusal (reading the footers) of a file of segments ``ids`` of table
    ``name`` is: a file spanning partitions of the table's transform (the committer stops), or
    a file whose values the table's statistics cannot hold, or that does not read
    (:class:`SegmentsRefused`: the committer sets the segment aside, ingest.table.refusals)."""
    segments = f"segment {ids[0]}" if len(ids) == 1 else f"segments {ids[0]}..{ids[-1]}"
    if isinstance(exc, ValueError) and "partition value" in str(exc).lower():
        return FileSpansPartitions(
            f"table {name}: a file of {segments} spans several partitions of its transform ({first_line(exc)}); "
            "it was built before the spec's file_partition cut files this finely"
        )
    return SegmentsRefused(f"table {name}: a file of {segments} cannot be added: {first_line(exc)}", ids)
