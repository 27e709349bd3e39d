"""The metastore's side of upsert tables (migrations/0025): per partition, the next offset whose
change an upsert table has not merged yet, advanced with the table's commit seq.

An upsert commit is recorded by :func:`fence_upsert` inside the transaction in which the
metastore's catalog swaps the table's metadata pointer (both or neither), or, for a catalog
outside the metastore, by :meth:`UpsertStore.record_upsert` right after the swap; a crash
between the two leaves the table one commit ahead, which the committer's reconcile records from
the table's own properties. Either way a commit is recorded only onto ``seq - 1``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from metastore.connection import wrap_exceptions
from metastore.errors import MetastoreError
from metastore.queries import query
from metastore.tables import StaleTableCommit, TableKind, TableNotEnabled, TableStore

#: A partition in an upsert table's offsets: "topic/partition" (a topic name has no "/").
PartitionKey = str


def partition_key(topic: str, partition: int) -> PartitionKey:
    return f"{topic}/{partition}"


@dataclass(frozen=True, slots=True)
class UpsertState:
    """What the metastore recorded of an upsert table: its commit seq, per partition the next
    offset not merged yet, the cross-partition keys counted so far."""

    seq: int
    offsets: Mapping[PartitionKey, int]
    cross_partition_keys: int
    last_commit_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PendingRange:
    """A current segment's range of one partition with changes not merged yet: rows from
    ``start`` (the partition's next unmerged offset, or the range's start) to ``end``."""

    segment_id: int
    topic: str
    partition: int
    start: int
    end: int
    files: tuple[str, ...]
    published_at: datetime

    @property
    def key(self) -> PartitionKey:
        return partition_key(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class UpsertCommit:
    source: str
    kind: TableKind
    seq: int
    offsets: Mapping[PartitionKey, int]
    cross_partition_keys: int
    snapshot_id: int | None
    committed_at: datetime
    # The segments whose rows it merged (logs and status only).
    segment_ids: tuple[int, ...] = field(default=())


def _locked_seq(cur: psycopg.Cursor[Any], commit: UpsertCommit) -> int:
    """The commit sequence the metastore recorded for ``commit``'s table, its row locked."""
    row = cur.execute(query("table_lock_row"), {"source": commit.source, "kind": commit.kind.value}).fetchone()
    if row is None:
        raise TableNotEnabled(commit.source)
    return int(row["committed_seq"])


def _advance(cur: psycopg.Cursor[Any], commit: UpsertCommit) -> None:
    """Write ``commit`` as the table's recorded commit; the caller locked the row and checked
    that the metastore is at ``seq - 1``."""
    cur.execute(
        query("upsert_advance"),
        {
            "source": commit.source,
            "kind": commit.kind.value,
            "seq": commit.seq,
            "offsets": json.dumps(dict(sorted(commit.offsets.items()))),
            "cross_partition_keys": commit.cross_partition_keys,
            "snapshot_id": commit.snapshot_id,
            "committed_at": commit.committed_at,
        },
    )


def fence_upsert(conn: psycopg.Connection[Any], commit: UpsertCommit, url: str = "") -> None:
    """Record ``commit`` in ``conn``'s open transaction: the metastore catalog's swap of the
    table's metadata pointer, before its COMMIT. StaleTableCommit (the swap is rolled back)
    unless the metastore is at ``seq - 1``."""
    with wrap_exceptions(url), conn.cursor(row_factory=dict_row) as cur:
        recorded = _locked_seq(cur, commit)
        if recorded != commit.seq - 1:
            raise StaleTableCommit(
                f"table {commit.source}/{commit.kind.value} commit {commit.seq}: "
                f"the metastore recorded commit {recorded}"
            )
        _advance(cur, commit)


class UpsertStore(TableStore):
    """:class:`TableStore` with what an upsert table's committer reads and records."""

    def upsert_state(self, source: str, kind: TableKind = TableKind.DATA) -> UpsertState:
        rows = self._fetch("upsert_state", source=source, kind=kind.value)
        if not rows:
            raise TableNotEnabled(source)
        row = rows[0]
        return UpsertState(
            int(row["committed_seq"]),
            {str(k): int(v) for k, v in dict(row["upsert_offsets"]).items()},
            int(row["cross_partition_keys"]),
            row["last_commit_at"],
        )

    def pending_ranges(self, source: str, offsets: Mapping[PartitionKey, int], limit: int) -> list[PendingRange]:
        """Up to ``limit`` ranges per partition with changes not merged yet, in offset order; the
        first of each partition starts at its next unmerged offset when that lies inside it."""
        rows = self._fetch("upsert_pending", source=source, offsets=json.dumps(dict(offsets)), limit=limit)
        ranges = []
        for r in rows:
            key = partition_key(r["topic"], int(r["partition"]))
            start = max(int(r["start_offset"]), offsets.get(key, int(r["start_offset"])))
            ranges.append(
                PendingRange(
                    int(r["segment_id"]),
                    str(r["topic"]),
                    int(r["partition"]),
                    start,
                    int(r["end_offset"]),
                    tuple(r["files"] or ()),
                    r["published_at"],
                )
            )
        return ranges

    def record_upsert(self, commit: UpsertCommit) -> bool:
        """Record ``commit`` in a transaction of its own (a catalog outside the metastore, or the
        reconcile of a commit the table holds and the metastore missed). Idempotent: a commit
        recorded already changes nothing and returns False; a gap is refused."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                recorded = _locked_seq(cur, commit)
                if commit.seq <= recorded:
                    return False
                if commit.seq != recorded + 1:
                    raise MetastoreError(
                        f"table {commit.source}/{commit.kind.value}: Iceberg commit {commit.seq} follows "
                        f"recorded commit {recorded}: commits in between were never recorded"
                    )
                _advance(cur, commit)
                return True
