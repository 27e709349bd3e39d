"""What ``ingest audit`` reads (the current segments, each partition's epochs) and its record
of each audit's result (migrations/0013_audit.sql)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from metastore.base import Row, StoreBase
from metastore.connection import wrap_exceptions
from metastore.queries import query


@dataclass(frozen=True, slots=True)
class AuditSnapshot:
    """What one audit reads, in one snapshot of the metastore."""

    partitions: list[Row]  # audit_partitions
    segments: list[Row]  # current_segments
    gaps: list[Row]  # list_gaps
    tables: list[Row]  # table_rows: each Iceberg table's recorded commit
    held: list[Row]  # table_held: the segments each table holds
    held_twice: list[Row]  # table_held_twice: held segments a held segment replaced
    refused: list[Row]  # table_refusals: pending segments a table could not take (migrations/0026)


class AuditsMixin(StoreBase):
    """The audit's inputs, and its results, newest last."""

    def current_segments(self, source: str) -> list[Row]:
        """The source's current segments (the one definition: ``current_segments`` in
        queries.sql), oldest first, with their ranges and the tables that hold them."""
        return self._fetch("current_segments", source=source)

    def audit_partitions(self, source: str) -> list[Row]:
        """Each partition's next_offset, epoch, epoch 0's start and its resets' offsets."""
        return self._fetch("audit_partitions", source=source)

    def audit_snapshot(self, source: str) -> AuditSnapshot:
        """The partitions (``audit_partitions``), the current segments, the gap ledger and the
        tables' records, read in one REPEATABLE READ transaction: one snapshot, so a publish,
        reset, skipped gap, replacement or table commit that commits meanwhile is seen whole or
        not at all."""
        params = {"source": source}
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                partitions = conn.execute(query("audit_partitions"), params).fetchall()
                segments = conn.execute(query("current_segments"), params).fetchall()
                gaps = conn.execute(query("list_gaps"), params).fetchall()
                tables = conn.execute(query("table_rows"), params).fetchall()
                held = conn.execute(query("table_held"), params).fetchall()
                twice = conn.execute(query("table_held_twice"), params).fetchall()
                refused = conn.execute(query("table_refusals"), params).fetchall()
        return AuditSnapshot(partitions, segments, gaps, tables, held, twice, refused)

    def table_refusals(self, source: str) -> list[Row]:
        """The pending segments the source's tables could not take because of their files
        (``table_refusals``; ingest.table.refusals): kind, segment_id, error, attempts, first_at,
        last_at."""
        return self._fetch("table_refusals", source=source)

    def record_audit(
        self,
        source: str,
        *,
        started_at: datetime,
        files: bool,
        tables: bool,
        partitions: int,
        segments: int,
        files_read: int,
        by_kind: Mapping[str, int],
        first_lines: Sequence[str],
    ) -> Row:
        rows = self._fetch(
            "record_audit",
            source=source,
            started_at=started_at,
            files=files,
            tables=tables,
            partitions=partitions,
            segments=segments,
            files_read=files_read,
            findings=sum(by_kind.values()),
            by_kind=Jsonb(dict(by_kind)),
            first_lines=list(first_lines),
        )
        return rows[0]

    def last_audit(self, source: str) -> Row | None:
        rows = self._fetch("last_audit", source=source)
        return rows[0] if rows else None
