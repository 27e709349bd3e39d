"""The metastore's side of the Iceberg tables (migrations/0009): which tables a source feeds,
which published segments each table holds, and the committer's lock.

Like :class:`metastore.store.Metastore`, one ``TableStore`` owns one connection, used by one
thread at a time; a broken connection is dropped and re-opened on the next call. The
committer's advisory lock lives on a connection of its own (:meth:`TableStore.try_lock`):
losing that connection loses the lock, which :meth:`TableStore.holds_lock` notices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg

from metastore.base import Row, StoreBase
from metastore.connection import ConnectionLimits, connect, wrap_exceptions
from metastore.errors import MetastoreError, SourceNotFound
from metastore.queries import query


class TableKind(StrEnum):
    """What a table holds: the segments' data files, or their rejects files."""

    DATA = "data"
    REJECTS = "rejects"


class TableNotEnabled(MetastoreError):
    """The source feeds no Iceberg table: ``ingest table enable SOURCE`` first."""

    def __init__(self, source: str) -> None:
        super().__init__(f"source {source!r} has no Iceberg table: enable one with `ingest table enable {source}`")
        self.source = source


@dataclass(frozen=True, slots=True)
class TableRow:
    source: str
    kind: TableKind
    partition_by: str
    enabled_at: datetime
    committed_seq: int
    last_snapshot_id: int | None
    last_commit_at: datetime | None


@dataclass(frozen=True, slots=True)
class PendingSegment:
    """A current segment the table does not hold yet. ``supersedes``: the segments the table
    holds that it replaced (compaction), whose files ``superseded_files`` its commit takes out."""

    id: int
    spec_version: int
    published_at: datetime
    files: tuple[str, ...]
    supersedes: tuple[int, ...] = ()
    superseded_files: tuple[str, ...] = ()


class TableStore(StoreBase):
    """The metastore's tables for the Iceberg committer, over :class:`StoreBase`'s connection;
    the committer's advisory lock is held on a second connection of its own."""

    def __init__(self, url: str, limits: ConnectionLimits | None = None) -> None:
        super().__init__(url, limits)
        self._lock_conn: psycopg.Connection[Row] | None = None

    def close(self) -> None:
        self.unlock()
        super().close()

    # -- tables -------------------------------------------------------------------

    def enable(self, source: str, kind: TableKind, partition_by: str) -> bool:
        """Record that the source feeds a table of this kind; False if it already did."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            if conn.execute(query("latest_spec"), {"name": source}).fetchone() is None:
                raise SourceNotFound(source)
            row = conn.execute(
                query("table_enable"), {"source": source, "kind": kind.value, "partition_by": partition_by}
            ).fetchone()
            return row is not None

    def tables(self, source: str) -> list[TableRow]:
        return [
            TableRow(
                source=r["source"],
                kind=TableKind(r["kind"]),
                partition_by=r["partition_by"],
                enabled_at=r["enabled_at"],
                committed_seq=int(r["committed_seq"]),
                last_snapshot_id=r["last_snapshot_id"],
                last_commit_at=r["last_commit_at"],
            )
            for r in self._fetch("table_rows", source=source)
        ]

    def table(self, source: str, kind: TableKind) -> TableRow:
        for row in self.tables(source):
            if row.kind is kind:
                return row
        raise TableNotEnabled(source)

    def latest_spec(self, source: str) -> dict[str, Any]:
        rows = self._fetch("latest_spec", name=source)
        if not rows:
            raise SourceNotFound(source)
        return dict(rows[0]["spec"])

    def pending(self, source: str, kind: TableKind, limit: int, after_id: int = 0) -> list[PendingSegment]:
        """Published segments the table does not hold yet, oldest first (ids above ``after_id``),
        each with the held segments it replaced (``supersedes``)."""
        rows = self._fetch("table_pending", source=source, kind=kind.value, limit=limit, after_id=after_id)
        superseded: dict[int, list[Row]] = {}
        if rows:
            ids = [int(r["id"]) for r in rows]
            for r in self._fetch("table_superseded", source=source, kind=kind.value, segment_ids=ids):
                superseded.setdefault(int(r["root"]), []).append(r)
        return [
            PendingSegment(
                int(r["id"]),
                int(r["spec_version"]),
                r["published_at"],
                tuple(r["files"] or ()),
                tuple(int(o["id"]) for o in superseded.get(int(r["id"]), ())),
                tuple(f for o in superseded.get(int(r["id"]), ()) for f in o["files"] or ()),
            )
            for r in rows
        ]

    def held(self, source: str) -> list[Row]:
        """Every segment a table of the source holds (``table_held``): kind, segment_id, current, files."""
        return self._fetch("table_held", source=source)

    def behind(self, source: str, kind: TableKind) -> tuple[int, datetime | None]:
        """Segments published and not in the table yet, and the oldest one's publish time."""
        row = self._fetch("table_behind", source=source, kind=kind.value)[0]
        return int(row["segments"]), row["oldest"]

    def last_segment(self, source: str, kind: TableKind) -> tuple[int | None, int]:
        """The newest segment appended to the table, and how many were."""
        row = self._fetch("table_last_segment", source=source, kind=kind.value)[0]
        return row["segment_id"], int(row["segments"])

    def published_files(self, source: str) -> frozenset[str]:
        return frozenset(r["f"] for r in self._fetch("table_published_files", source=source))

    def record_empty(self, source: str, kind: TableKind, segment_ids: Sequence[int]) -> None:
        """Segments with no file of this kind: held by the table without a commit."""
        if segment_ids:
            self._fetch_none(
                "table_record_segments", source=source, kind=kind.value, seq=None, segment_ids=list(segment_ids)
            )

    def record_commit(
        self,
        source: str,
        kind: TableKind,
        seq: int,
        segment_ids: Sequence[int],
        snapshot_id: int | None,
        committed_at: datetime,
        removed_ids: Sequence[int] = (),
    ) -> bool:
        """Record Iceberg commit ``seq`` (the segments it appended, and ``removed_ids``: the
        replaced segments whose files it took out), in one transaction.

        Idempotent: a commit recorded already (by a committer that reconciled first, or a
        zombie's late write) changes nothing and returns False. A gap (``seq`` more than one
        past the recorded one) is refused: every commit is recorded before the next is made."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                row = conn.execute(query("table_lock_row"), {"source": source, "kind": kind.value}).fetchone()
                if row is None:
                    raise TableNotEnabled(source)
                recorded = int(row["committed_seq"])
                if seq <= recorded:
                    return False
                if seq != recorded + 1:
                    raise MetastoreError(
                        f"table {source}/{kind.value}: Iceberg commit {seq} follows recorded commit {recorded}: "
                        "commits in between were never recorded"
                    )
                conn.execute(
                    query("table_record_segments"),
                    {"source": source, "kind": kind.value, "seq": seq, "segment_ids": list(segment_ids)},
                )
                if removed_ids:
                    conn.execute(
                        query("table_record_removed"),
                        {"source": source, "kind": kind.value, "seq": seq, "segment_ids": list(removed_ids)},
                    )
                conn.execute(
                    query("table_advance"),
                    {
                        "source": source,
                        "kind": kind.value,
                        "seq": seq,
                        "snapshot_id": snapshot_id,
                        "committed_at": committed_at,
                    },
                )
                return True

    # -- the committer's lock -------------------------------------------------------

    def try_lock(self, source: str) -> bool:
        """Take the source's committer lock on a dedicated connection (held until it closes).
        Keyed by a 64-bit hash of the source's name (queries.sql, ``table_lock``): sources do
        not share a lock unless their 64-bit hashes collide."""
        if self.holds_lock():
            return True
        with wrap_exceptions(self.url):
            conn = connect(self.url, self._limits)
            row = conn.execute(query("table_lock"), {"source": source}).fetchone()
            if row is not None and row["locked"]:
                self._lock_conn = conn
                return True
            conn.close()
            return False

    def holds_lock(self) -> bool:
        """True while the lock's connection is alive (a round trip proves it)."""
        conn = self._lock_conn
        if conn is None:
            return False
        try:
            conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            conn.close()
            self._lock_conn = None
            return False

    def unlock(self) -> None:
        if self._lock_conn is not None:
            self._lock_conn.close()
            self._lock_conn = None
