"""The metastore's side of the Iceberg tables (migrations/0009): which tables a source feeds,
which published segments each table holds, and the committer's lock.

Like :class:`metastore.store.Metastore`, one ``TableStore`` owns one connection, used by one
thread at a time; a broken connection is dropped and re-opened on the next call. The
committer's advisory lock lives on a connection of its own (:meth:`TableStore.try_lock`):
losing that connection loses the lock, which :meth:`TableStore.holds_lock` notices.

A table commit is recorded by :func:`fence_commit`, inside the transaction in which the
catalog swaps the table's metadata pointer (the catalog's tables are in this database): the
swap and its record commit together or not at all, and only while every segment the commit
appends is still current and the held segments it takes out are exactly those its segments
replaced. So the metastore never lags the table, and gc (which deletes a replaced segment's
files only once no table holds it, ``replaced_to_delete``) never deletes a file a commit may
still put in a table, however long its committer was frozen before the swap.

A catalog outside this database (a spec's ``[table] catalog``) swaps in no transaction of it:
its commit is checked the same way and recorded as an *intent* before the swap
(:meth:`TableStore.record_intent`), and recorded after it (:meth:`TableStore.record_commit`).
gc keeps the files of the segments a live intent names (migrations/0023), so a committer frozen
between its intent and its swap never puts a deleted file in a table; one frozen before its
intent is refused by the intent's check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from psycopg.rows import dict_row

from metastore.base import Row, StoreBase
from metastore.connection import ConnectionLimits, connect, wrap_exceptions
from metastore.errors import MetastoreError, SourceNotFound
from metastore.queries import query


class TableKind(StrEnum):
    """What a table holds: the segments' data files, or their rejects files."""

    DATA = "data"
    REJECTS = "rejects"


class StaleTableCommit(MetastoreError):
    """A table commit no longer matches the metastore (a segment it appends was replaced or
    is held already, or the held segments its segments replaced changed since it was chosen):
    nothing of it is recorded, and the catalog's swap is rolled back with it."""


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


@dataclass(frozen=True, slots=True)
class TableCommit:
    """One Iceberg commit as the metastore records it: commit ``seq`` of the table appended
    ``segment_ids`` and took out the files of the held segments ``removed_ids`` (a
    replacement), as the Iceberg snapshot ``snapshot_id``."""

    source: str
    kind: TableKind
    seq: int
    segment_ids: tuple[int, ...]
    snapshot_id: int | None
    committed_at: datetime
    removed_ids: tuple[int, ...] = ()


def _recorded_seq(cur: psycopg.Cursor[Row], commit: TableCommit) -> int:
    """The table's recorded commit, its row locked until the transaction ends (a commit and
    its record are serialized against any other record of the table)."""
    row = cur.execute(query("table_lock_row"), {"source": commit.source, "kind": commit.kind.value}).fetchone()
    if row is None:
        raise TableNotEnabled(commit.source)
    return int(row["committed_seq"])


def _write(cur: psycopg.Cursor[Row], commit: TableCommit) -> None:
    params: dict[str, Any] = {"source": commit.source, "kind": commit.kind.value, "seq": commit.seq}
    cur.execute(query("table_record_segments"), {**params, "segment_ids": list(commit.segment_ids)})
    cur.execute(query("table_clear_refusals"), {**params, "segment_ids": list(commit.segment_ids)})
    if commit.removed_ids:
        cur.execute(query("table_record_removed"), {**params, "segment_ids": list(commit.removed_ids)})
    cur.execute(
        query("table_advance"), {**params, "snapshot_id": commit.snapshot_id, "committed_at": commit.committed_at}
    )
    cur.execute(query("table_settle_intents"), params)


def fence_commit(conn: psycopg.Connection[Any], commit: TableCommit, url: str = "") -> None:
    """Record ``commit`` in ``conn``'s open transaction: the one in which the catalog swaps the
    table's metadata pointer, after the swap and before its COMMIT. Raises StaleTableCommit
    (the caller rolls the swap back) unless the metastore is at commit ``seq - 1``, every
    segment it appends is current and held by no commit of the table yet, and the held segments
    its segments replaced are exactly ``removed_ids``. The appended segments stay locked
    (FOR SHARE) until the transaction ends, so a replacement of them (FOR UPDATE) is ordered
    after the commit and its record, and sees them held."""
    with wrap_exceptions(url), conn.cursor(row_factory=dict_row) as cur:
        _check(cur, commit)
        _write(cur, commit)


def _check(cur: psycopg.Cursor[Row], commit: TableCommit) -> None:
    """Raise StaleTableCommit unless the metastore is at commit ``seq - 1``, every segment the
    commit appends is current and held by no commit yet, and the held segments its segments
    replaced are exactly ``removed_ids``; the table's row and the appended segments stay
    locked until the transaction ends."""
    ids = sorted(commit.segment_ids)
    params = {"source": commit.source, "kind": commit.kind.value, "segment_ids": ids}
    name = f"table {commit.source}/{commit.kind.value} commit {commit.seq}"
    if (recorded := _recorded_seq(cur, commit)) != commit.seq - 1:
        raise StaleTableCommit(f"{name}: the metastore recorded commit {recorded}")
    segments = cur.execute(query("table_fence_segments"), params).fetchall()
    if stale := sorted(set(ids) - {int(s["id"]) for s in segments if s["current"] and not s["held"]}):
        raise StaleTableCommit(f"{name}: segments {stale} are no longer current, or held already")
    taken = sorted({int(r["id"]) for r in cur.execute(query("table_superseded"), params).fetchall()})
    if taken != sorted(commit.removed_ids):
        removed = sorted(commit.removed_ids)
        raise StaleTableCommit(f"{name}: its segments replaced held segments {taken}, not {removed}")


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

    def next_batch(
        self, source: str, kind: TableKind, limit: int, skip: frozenset[int] = frozenset()
    ) -> list[PendingSegment]:
        """The table committer's next batch: up to ``limit`` pending segments with files of this
        kind to append, or one replacement of segments the table holds (committed alone),
        whichever comes first; the segments ``skip`` names (refused by the table, not due for
        another try) are passed over and stay pending. Segments without any file (offsets
        without records, or no rejects) that replace nothing the table holds are recorded as
        held on the way: there is nothing of them to append, so nothing to append twice. Every
        page is read in one REPEATABLE READ snapshot: a replacement committed between two pages
        would put a segment and the segments it replaced in one batch."""
        batch: list[PendingSegment] = []
        empty: list[int] = []
        after = 0
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                while len(batch) < limit:
                    page = self.pending(source, kind, limit, after_id=after)
                    pending = [s for s in page if s.id not in skip]
                    empty += [s.id for s in pending if not s.files and not s.supersedes]
                    if replacing := next((s for s in pending if s.supersedes), None):
                        batch += [s for s in pending if s.files and s.id < replacing.id][: limit - len(batch)]
                        batch = batch or [replacing]
                        break
                    batch += [s for s in pending if s.files][: limit - len(batch)]
                    if len(page) < limit:
                        break
                    after = page[-1].id
        self.record_empty(source, kind, empty)
        return batch

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

    def pending_segment(self, source: str, kind: TableKind, segment_id: int) -> PendingSegment | None:
        """The segment as :meth:`pending` gives it, if it is still pending (None: the table
        holds it, or compaction replaced it)."""
        found = self.pending(source, kind, 1, after_id=segment_id - 1)
        return found[0] if found and found[0].id == segment_id else None

    def refuse(self, source: str, kind: TableKind, segment_id: int, error: str) -> None:
        """Record that the table could not take the segment (migrations/0026): it stays pending."""
        self._fetch_none("table_refuse", source=source, kind=kind.value, segment_id=segment_id, error=error[:2000])

    def clear_refusals(self, source: str, kind: TableKind, segment_ids: Sequence[int]) -> None:
        if segment_ids:
            self._fetch_none("table_clear_refusals", source=source, kind=kind.value, segment_ids=list(segment_ids))

    def refusals(self, source: str) -> list[Row]:
        """The segments the source's tables refused and still lack (``table_refusals``): kind,
        segment_id, error, attempts, first_at, last_at."""
        return self._fetch("table_refusals", source=source)

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

    def record_intent(self, commit: TableCommit) -> None:
        """Before a commit to a catalog outside the metastore: check it as :func:`fence_commit`
        does (StaleTableCommit: a conflict, nothing recorded) and record its intent, in one
        transaction. While the table's recorded commit is below ``commit.seq``, gc keeps the
        files of the segments it appends (migrations/0023)."""
        params = {
            "source": commit.source,
            "kind": commit.kind.value,
            "seq": commit.seq,
            "segment_ids": list(commit.segment_ids),
        }
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                _check(cur, commit)
                cur.execute(query("table_record_intent"), params)

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
        replaced segments whose files it took out), in one transaction of its own: a commit the
        table holds and the metastore did not record (the reconcile), or one just made to a
        catalog outside the metastore (:func:`fence_commit` records every commit to the
        metastore's own catalog in the catalog's swap).

        Idempotent: a commit recorded already changes nothing and returns False. A gap (``seq``
        more than one past the recorded one) is refused."""
        commit = TableCommit(source, kind, seq, tuple(segment_ids), snapshot_id, committed_at, tuple(removed_ids))
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                recorded = _recorded_seq(cur, commit)
                if seq <= recorded:
                    return False
                if seq != recorded + 1:
                    raise MetastoreError(
                        f"table {source}/{kind.value}: Iceberg commit {seq} follows recorded commit {recorded}: "
                        "commits in between were never recorded"
                    )
                _write(cur, commit)
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
