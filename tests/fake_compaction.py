"""The in-memory side of segment replacement (metastore/compaction.py), mixed into
tests.fake_metastore.MemoryMetastore; tests/contract runs the same tests against it and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace

from ingest_common.model import BuiltSegment, OffsetRange, PublishRange, SegmentToPublish, TopicPartition
from metastore.errors import ReplaceRefused


class CompactionFake:
    """Replacement as migrations/0017 does it, over the fake's published segments (segment ids
    are publish order, from 1). No epochs and no tables here: every range is of epoch 0."""

    segments: dict[uuid.UUID, SegmentToPublish]
    splits: dict[uuid.UUID, str]
    lock: threading.Lock
    source: str

    def _call(self, source: str | None) -> None: ...

    @property
    def replaced(self) -> dict[int, int]:
        """Replaced segment id -> the id of the segment that replaced it."""
        return self.__dict__.setdefault("_replaced", {})

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
        with self.lock:
            self._call(source)
            ids = list(self.segments)
            if split_id in self.segments:
                return ids.index(split_id) + 1
            wanted = sorted(set(old_ids))
            if not wanted or any(not 1 <= i <= len(ids) for i in wanted):
                raise ReplaceRefused("missing", f"not every one of {wanted} is a segment of {source}")
            if any(i in self.replaced for i in wanted):
                raise ReplaceRefused("replaced", "an old segment is no longer current")
            old = [self.segments[ids[i - 1]] for i in wanted]
            if len({o.spec_version for o in old}) > 1:
                raise ReplaceRefused("spec_version", "the old segments differ in spec version")
            if sum(o.segment.row_count for o in old) != row_count:
                raise ReplaceRefused("row_count", f"the new files hold {row_count} rows")
            union = _union([r.range for o in old for r in o.ranges])
            if self.splits.get(split_id) != "building":
                reason = "abandoned" if split_id in self.splits else "unregistered"
                raise ReplaceRefused(reason, f"the compaction's split {split_id} is {reason}")
            self.splits[split_id] = "published"
            segment = BuiltSegment(
                split_id=split_id,
                location=location,
                files=tuple(files),
                row_count=row_count,
                size_bytes=size_bytes,
                rejects_files=tuple(f for o in old for f in o.segment.rejects_files),
                rejects_count=sum(o.segment.rejects_count for o in old),
                skipped_count=sum(o.segment.skipped_count for o in old),
            )
            self.segments[split_id] = replace(
                old[0], worker_id=worker, segment=segment, ranges=tuple(PublishRange(r, 0) for r in union)
            )
            new_id = len(self.segments)
            for i in wanted:
                self.replaced[i] = new_id
            return new_id

    def current_ranges(self, source: str) -> dict[int, tuple[OffsetRange, ...]]:
        with self.lock:
            self._call(source)
            return {
                n: tuple(sorted((r.range for r in item.ranges), key=lambda r: r.tp))
                for n, item in enumerate(self.segments.values(), start=1)
                if n not in self.replaced
            }


def _union(ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """Per partition, the one range the contiguous ``ranges`` make (ReplaceRefused otherwise)."""
    by_tp: dict[TopicPartition, list[OffsetRange]] = {}
    for r in ranges:
        by_tp.setdefault(r.tp, []).append(r)
    union = []
    for tp, parts in sorted(by_tp.items()):
        parts.sort(key=lambda r: r.start)
        for prev, nxt in itertools.pairwise(parts):
            if prev.end != nxt.start:
                raise ReplaceRefused("ranges", f"the old ranges of {tp} are not contiguous")
        union.append(OffsetRange(tp, parts[0].start, parts[-1].end))
    return union
