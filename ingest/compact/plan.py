"""Which segments a compaction rewrites, from the metastore's current segments alone.

A *chunk* becomes one new segment. Its segments cover one partition, in one epoch, under one
spec version (one schema), and follow each other without gap, so the new segment's one range
is exactly their union (the metastore checks it again). A segment is *small* when its data
files average below the target size; a segment without data files (every record rejected or
skipped, or offsets without records) is small too. Segments covering several partitions are
left alone (workers publish one partition per segment, and so does compaction).

Runs of contiguous small segments are cut into chunks of at most the target size, oldest
offsets first. A chunk is compacted only if it has two segments or more and no segment of it
holds more than half its bytes, unless that segment is below a sixteenth of the target (cheap
to copy again): a file grown near the target is not rewritten again and again to add a few
small ones (each byte is rewritten about log2(target / segment size) times at most). A chunk
whose largest segment dominates loses everything up to and including that segment, and the
rest is considered again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingest_common.model import PartitionBy, TopicPartition

# More old segments per replacement would make one transaction lock too many rows.
MAX_SEGMENTS_PER_CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """A current single-partition segment, as the metastore lists it."""

    id: int
    tp: TopicPartition
    epoch: int
    spec_version: int
    start: int
    end: int
    files: tuple[str, ...]
    rows: int
    size_bytes: int
    rejects_files: tuple[str, ...]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Candidate | None:
        """None for a segment of several partitions (never compacted)."""
        ranges = row["ranges"]
        if len(ranges) != 1:
            return None
        r = ranges[0]
        return cls(
            id=int(row["id"]),
            tp=TopicPartition(r["topic"], int(r["partition"])),
            epoch=int(r.get("epoch", 0)),
            spec_version=int(row["spec_version"]),
            start=int(r["start"]),
            end=int(r["end"]),
            files=tuple(row["files"]),
            rows=int(row["row_count"]),
            size_bytes=int(row["size_bytes"]),
            rejects_files=tuple(row["rejects_files"]),
        )

    def small(self, target_bytes: int) -> bool:
        return not self.files or self.size_bytes / len(self.files) < target_bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """Segments that become one: one partition, one epoch, one spec version, contiguous."""

    segments: tuple[Candidate, ...]

    @property
    def tp(self) -> TopicPartition:
        return self.segments[0].tp

    @property
    def start(self) -> int:
        return self.segments[0].start

    @property
    def end(self) -> int:
        return self.segments[-1].end

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(s.id for s in self.segments)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for s in self.segments for f in s.files)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def spec_version(self) -> int:
        return self.segments[0].spec_version


def choose(rows: Iterable[Mapping[str, Any]], target_bytes: int) -> list[Chunk]:
    """The chunks worth compacting among the current segments ``rows`` (``Metastore.segments``),
    by partition, then offset."""
    groups: dict[tuple[TopicPartition, int, int], list[Candidate]] = {}
    for row in rows:
        c = Candidate.from_row(row)
        if c is not None and c.small(target_bytes):
            groups.setdefault((c.tp, c.epoch, c.spec_version), []).append(c)
    chunks: list[Chunk] = []
    for _key, group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        group.sort(key=lambda c: c.start)
        for run in _runs(group):
            chunks.extend(_pack(run, target_bytes))
    return chunks


def file_cut(written: PartitionBy, latest: PartitionBy, table: PartitionBy | None) -> PartitionBy:
    """How a chunk's new files are cut: by the finest of the ``file_partition`` its segments
    were written under (``written``), the latest spec's, and the source's Iceberg data table's
    partition transform. Old segments may be cut coarser than the table (written when the spec
    cut no files; the table partitioned by day since), each within one partition of it while
    their union is not, and the committer registers only files that lie in one partition. The
    latest spec's cut covers every transform ``ingest table-enable`` accepts now."""
    return PartitionBy.finest(written, latest, table or PartitionBy.NONE)


def _runs(group: Sequence[Candidate]) -> list[list[Candidate]]:
    """Maximal runs of segments where each starts at the previous one's end."""
    runs: list[list[Candidate]] = []
    for c in group:
        if runs and runs[-1][-1].end == c.start:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def _pack(run: list[Candidate], target_bytes: int) -> list[Chunk]:
    cheap = target_bytes // 16
    chunks: list[Chunk] = []
    current: list[Candidate] = []
    for c in run:
        if current and (
            sum(s.size_bytes for s in current) + c.size_bytes > target_bytes or len(current) >= MAX_SEGMENTS_PER_CHUNK
        ):
            chunks.extend(_worth(current, cheap))
            current = []
        current.append(c)
    chunks.extend(_worth(current, cheap))
    return chunks


def _worth(segments: list[Candidate], cheap: int) -> list[Chunk]:
    """The chunk, if rewriting it is worth it; otherwise what is left after its dominant segment."""
    while len(segments) >= 2:
        total = sum(s.size_bytes for s in segments)
        largest = max(range(len(segments)), key=lambda i: segments[i].size_bytes)
        if 2 * segments[largest].size_bytes <= total or segments[largest].size_bytes < cheap:
            return [Chunk(tuple(segments))]
        segments = segments[largest + 1 :]
    return []
