"""Segments: the serial-guarded publish, the split registry (builds registered before they
write, abandoned and swept by gc) and reading what was published."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from ingest_common.model import BuildRegistration, SegmentToPublish
from metastore.base import Row, StoreBase, conflict_from_row
from metastore.connection import wrap_exceptions
from metastore.errors import Session
from metastore.queries import query


class SegmentsMixin(StoreBase):
    """Publish segments, register and sweep builds (migrations/0008), list segments and conflicts."""

    def publish(self, item: SegmentToPublish) -> int:
        """The serial-guarded publish, as one statement (one transaction, one round trip):
        locks the partition rows in a fixed order, checks for each that the serial is the
        one seen at assign and that the range starts at the stored next offset, then inserts
        the segment and advances the offsets (``ingest_publish_segment``, migrations 0007,
        0008, 0011; 0020 stores each range's leader epoch with its end, 0028 the segment's
        holes). Idempotent by split id: a split already published answers with its segment's
        id, whatever the checks say now (a retry after a lost reply).

        Raises PublishConflict (nothing of the segment written, conflict recorded) or
        CommitOutcomeUnknown (the connection broke before the reply came back: the server's
        session may have committed, or may still commit later).
        """
        ranges = sorted(item.ranges, key=lambda r: r.range.tp)
        seg = item.segment
        params = {
            "source": item.source,
            "split_id": seg.split_id,
            "spec_version": item.spec_version,
            "worker": item.worker_id,
            "location": seg.location,
            "files": list(seg.files),
            "row_count": seg.row_count,
            "size_bytes": seg.size_bytes,
            "min_event_time": seg.min_event_time,
            "max_event_time": seg.max_event_time,
            "rejects_location": seg.rejects_location,
            "rejects_files": list(seg.rejects_files),
            "rejects_count": seg.rejects_count,
            "skipped_count": seg.skipped_count,
            "topics": [r.range.tp.topic for r in ranges],
            "partitions": [r.range.tp.partition for r in ranges],
            "serials": [r.serial for r in ranges],
            "starts": [r.range.start for r in ranges],
            "ends": [r.range.end for r in ranges],
            "leader_epochs": [r.leader_epoch for r in ranges],
            "holes": seg.holes,
        }
        row = self._commit_one("publish_segment", params, f"publishing split {seg.split_id}")
        if row["segment_id"] is None:
            raise conflict_from_row(row)
        return int(row["segment_id"])

    def end_session(self, session: Session) -> bool:
        """True once ``session`` is gone, with whatever transaction it ran; else it is told to
        end and this returns False (ask again). After a CommitOutcomeUnknown, the lookup of the
        split is final only then: the session may still be running the publish, or may still
        receive it from the network."""
        return not self._fetch("end_session", pid=session.pid, started=session.started)

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        rows = self._fetch("segment_for_split", split_id=split_id)
        return int(rows[0]["id"]) if rows else None

    def segments(self, source: str, since: datetime | None = None, limit: int | None = None) -> list[Row]:
        """The source's segments, oldest first; with ``since`` / ``limit``: only those published
        at or after ``since``, and only the newest ``limit`` of them."""
        return self._fetch("list_segments", source=source, since=since, limit=limit)

    def conflict_counts(self, source: str) -> dict[str, int]:
        return {row["reason"]: int(row["n"]) for row in self._fetch("conflict_counts", source=source)}

    def register_build(self, worker: str, build: BuildRegistration) -> None:
        """Register a build's locations and splits before it writes anything. Idempotent:
        after an unknown outcome, registering again is safe."""
        self._fetch_none(
            "register_build",
            build_id=build.build_id,
            source=build.source,
            worker=worker,
            staging=build.staging,
            data=build.data,
            rejects=build.rejects,
            split_ids=list(build.split_ids),
        )

    def abandon_stale_splits(self, source: str, grace_s: float, dry_run: bool = False) -> list[uuid.UUID]:
        """Give up the splits still building after ``grace_s``: from the commit of this call
        on, their publish is refused. ``dry_run``: only say which."""
        rows = self._fetch("stale_splits" if dry_run else "abandon_splits", source=source, grace_s=grace_s)
        return [r["split_id"] for r in rows]

    def builds_to_sweep(self, source: str, grace_s: float) -> list[Row]:
        """Builds of the source that gc sweeps now (the rule is ``ingest.ops.gc``'s), each with
        ``sweeps`` (how many it had) and ``keep``: the files its published segments list."""
        return self._fetch("builds_to_sweep", source=source, grace_s=grace_s)

    def sweep_build(self, source: str, build_id: uuid.UUID, sweeps: int, sweep: Callable[[], int]) -> bool:
        """Run ``sweep`` (it deletes, and returns how many files it deleted) while holding the
        build's row, then record the sweep in the same transaction. False, and ``sweep`` not
        run, when another gc holds the build or swept it after ``sweeps`` was read. A lost
        connection rolls the record back: a sweep counts only if the row was held throughout,
        so two gc runs never both decide from one state (a sweep that found nothing because
        another deleted first must not close the build)."""
        params = {"source": source, "build_id": build_id, "sweeps": sweeps}
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                if conn.execute(query("lock_build_for_sweep"), params).fetchone() is None:
                    return False
                deleted = sweep()
                conn.execute(query("mark_swept"), {**params, "deleted": deleted})
        return True

    def build_counts(self, source: str) -> Row:
        """The source's builds: ``open`` (gc sweeps them later), ``building`` (open, a split of
        theirs still building), ``unswept`` (never swept) and ``total``."""
        return self._fetch("build_counts", source=source)[0]
