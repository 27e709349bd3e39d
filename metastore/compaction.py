"""Segment replacement (compaction, migrations/0017): current segments replaced by one segment
covering exactly their offsets, and the replaced segments' files deleted by gc later."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

import psycopg

from ingest_common.model import OffsetRange, PartitionBy, TopicPartition
from metastore.base import Row, StoreBase
from metastore.connection import BoundedConnection, connect, wrap_exceptions
from metastore.errors import ReplaceRefused
from metastore.queries import query


class CompactionMixin(StoreBase):
    """Replace segments; list and delete what replaced segments leave behind; the compactor's
    lock (on a connection of its own, held until it closes)."""

    _compact_lock_conn: BoundedConnection[Row] | None = None

    def try_compact_lock(self, source: str) -> bool:
        """Take (or still hold) the source's compactor lock; False if another compactor holds it."""
        conn = self._compact_lock_conn
        if conn is not None:
            try:
                conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                self.release_compact_lock()
        with wrap_exceptions(self.url):
            conn = connect(self.url, self._limits)
            row = conn.execute(query("compact_lock"), {"source": source}).fetchone()
            if row is not None and row["locked"]:
                self._compact_lock_conn = conn
                return True
            conn.close()
            return False

    def close(self) -> None:
        self.release_compact_lock()
        super().close()

    def release_compact_lock(self) -> None:
        if self._compact_lock_conn is not None:
            self._compact_lock_conn.close()
            self._compact_lock_conn = None

    def replace_segments(
        self,
        source: str,
        split_id: uuid.UUID,
        worker: str,
        old_ids: Sequence[int],
        location: str,
        files: Sequence[str],
        row_count: int,
        size_bytes: int,
    ) -> int:
        """Replace the current segments ``old_ids`` by one segment listing ``files`` (written
        under the build that registered ``split_id``), in one transaction: the old segments
        are locked and must all still be current; the new one covers exactly the union of
        their ranges (in their epoch) and carries their rejects files and counts; next_offset
        is not touched, a partition whose last segment it replaces points to it (0021).
        Idempotent by split id: a split that already has its segment answers with its id.
        Returns the new segment's id.

        Raises ReplaceRefused (nothing written) or CommitOutcomeUnknown (the connection broke
        before the reply: end the session, then call again)."""
        params = {
            "source": source,
            "split_id": split_id,
            "worker": worker,
            "old_ids": sorted(old_ids),
            "location": location,
            "files": list(files),
            "row_count": row_count,
            "size_bytes": size_bytes,
        }
        row = self._commit_one("replace_segments", params, f"replacing segments with split {split_id}")
        if row["segment_id"] is None:
            raise ReplaceRefused(row["reason"], row["detail"])
        return int(row["segment_id"])

    def table_partition(self, source: str) -> PartitionBy | None:
        """The partition transform of the source's Iceberg data table (None: no table)."""
        rows = [r for r in self._fetch("table_rows", source=source) if r["kind"] == "data"]
        return PartitionBy(rows[0]["partition_by"]) if rows else None

    def current_ranges(self, source: str) -> dict[int, tuple[OffsetRange, ...]]:
        """The ranges of every current segment of the source, by segment id."""
        return {
            int(seg["id"]): tuple(
                OffsetRange(TopicPartition(r["topic"], int(r["partition"])), int(r["start"]), int(r["end"]))
                for r in seg["ranges"]
            )
            for seg in self._fetch("list_segments", source=source, since=None, limit=None)
        }

    def replaced_to_delete(self, source: str, grace_s: float) -> list[Row]:
        """Replaced segments whose files gc deletes now (the rule is ``ingest.ops.gc``'s), each
        with ``files``: those no current segment lists, under the source's registered builds.
        A segment an Iceberg table still holds waits for the committer (migrations/0019)."""
        return self._fetch("replaced_to_delete", source=source, grace_s=grace_s)

    def delete_replaced_files(
        self, source: str, segment_id: int, delete: Callable[[], int], grace_s: float = 0.0
    ) -> bool:
        """Run ``delete`` while holding the replaced segment's row, then record that its files
        are gone, in the same transaction. False, and ``delete`` not run, when another gc holds
        the segment or already did, or an Iceberg table holds its files (or did less than
        ``grace_s`` ago)."""
        params = {"source": source, "segment_id": segment_id, "grace_s": grace_s}
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                if conn.execute(query("lock_replaced_for_delete"), params).fetchone() is None:
                    return False
                delete()
                conn.execute(query("mark_files_deleted"), params)
        return True

    def replaced_counts(self, source: str) -> Row:
        """Replaced segments: ``pending`` (their files not yet deleted) and ``total``."""
        return self._fetch("replaced_counts", source=source)[0]
