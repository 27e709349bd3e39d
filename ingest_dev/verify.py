"""The exactly-once check: read every published segment's files and compare the Kafka
coordinates found there with what was produced.

Used by the tests, the demo and the chaos run. It trusts nothing but the metastore's
segment rows and the Parquet files they point to.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from ingest.segments import store as segment_store
from metastore import Metastore

Coord = tuple[str, int]


@dataclass
class Verification:
    rows: int = 0
    rejects: int = 0
    skipped: int = 0
    segments: int = 0
    missing: dict[Coord, list[int]] = field(default_factory=dict)
    duplicates: dict[Coord, list[int]] = field(default_factory=dict)
    unexpected: dict[Coord, list[int]] = field(default_factory=dict)
    range_errors: list[str] = field(default_factory=list)
    offset_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.unexpected or self.range_errors or self.offset_errors)

    def summary(self) -> str:
        def count(d: dict[Coord, list[int]]) -> int:
            return sum(len(v) for v in d.values())

        return (
            f"segments={self.segments} rows={self.rows} rejects={self.rejects} skipped={self.skipped} "
            f"missing={count(self.missing)} duplicated={count(self.duplicates)} "
            f"unexpected={count(self.unexpected)} range_errors={len(self.range_errors)} "
            f"offset_errors={len(self.offset_errors)}"
        )


def read_coordinates(uri: str) -> list[tuple[str, int, int]]:
    filesystem, path = segment_store.filesystem(uri)
    table = pq.read_table(path, columns=["_topic", "_partition", "_offset"], filesystem=filesystem)
    return list(
        zip(table["_topic"].to_pylist(), table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True)
    )


def count_rows(uri: str) -> int:
    filesystem, path = segment_store.filesystem(uri)
    return int(pq.ParquetFile(path, filesystem=filesystem).metadata.num_rows)


def verify_exactly_once(
    store: Metastore,
    source: str,
    expected: dict[Coord, list[int]],
    skipped_ok: bool = False,
    log_ends: Mapping[Coord, int] | None = None,
) -> Verification:
    """``expected``: for each (topic, partition) the offsets produced (from delivery reports).

    Checks that every expected offset is in exactly one published file (data or rejects),
    that no other offset is, that each partition's published ranges tile ``[first, end)``
    without gap or overlap, and that the stored next offset equals the log end: the last
    expected offset + 1, or ``log_ends`` where offsets past the last record carry none
    (a transactional producer's markers, aborted records, compacted records).
    """
    result = Verification()
    seen: Counter[tuple[str, int, int]] = Counter()
    ranges: dict[Coord, list[tuple[int, int]]] = {}
    for seg in store.segments(source):
        result.segments += 1
        result.rows += int(seg["row_count"])
        result.rejects += int(seg["rejects_count"])
        result.skipped += int(seg["skipped_count"])
        for uri in list(seg["files"]) + list(seg["rejects_files"]):
            seen.update(read_coordinates(uri))
        for r in seg["ranges"]:
            ranges.setdefault((r["topic"], r["partition"]), []).append((r["start"], r["end"]))
    if result.skipped and not skipped_ok:
        result.offset_errors.append(f"{result.skipped} records were skipped (policy skip): not verifiable")
    by_partition: dict[Coord, Counter[int]] = {}
    for (topic, partition, offset), n in seen.items():
        by_partition.setdefault((topic, partition), Counter())[offset] = n
    for coord in set(expected) | set(by_partition):
        want = set(expected.get(coord, []))
        got = by_partition.get(coord, Counter())
        if (missing := sorted(want - set(got))) and not skipped_ok:
            result.missing[coord] = missing
        if dup := sorted(o for o, n in got.items() if n > 1):
            result.duplicates[coord] = dup
        if extra := sorted(set(got) - want):
            result.unexpected[coord] = extra
    stored = {(r["topic"], r["partition"]): r["next_offset"] for r in store.partitions(source)}
    # The one hole allowed between published ranges: a gap the ledger says was skipped
    # (on_offset_out_of_range = "earliest"), exactly from where one range ends to where the next starts.
    skipped_gaps = {
        (g["topic"], g["partition"], g["from_offset"]): g["to_offset"] for g in store.gaps(source) if g["skipped"]
    }
    for coord, offsets in expected.items():
        if not offsets:
            continue
        end = log_ends[coord] if log_ends is not None and coord in log_ends else max(offsets) + 1
        spans = sorted(ranges.get(coord, []))
        position = min(offsets) if not spans else spans[0][0]
        if spans and spans[0][0] > min(offsets):
            result.range_errors.append(f"{coord}: first range starts at {spans[0][0]} > first offset {min(offsets)}")
        for start, stop in spans:
            if start != position and skipped_gaps.get((*coord, position)) == start:
                position = start
            if start != position:
                result.range_errors.append(f"{coord}: range [{start}, {stop}) does not start at {position}")
            position = stop
        if position != end:
            result.range_errors.append(f"{coord}: ranges end at {position}, log end is {end}")
        if stored.get(coord) != end:
            result.offset_errors.append(f"{coord}: stored next_offset {stored.get(coord)} != log end {end}")
    return result


ExpectedRow = Callable[[str, int, int], Mapping[str, Any] | None]


def verify_payloads(
    store: Metastore, source: str, expected: ExpectedRow, columns: Sequence[str], limit: int = 20
) -> tuple[int, list[str]]:
    """Compare ``columns`` of every published data row with ``expected(topic, partition, offset)``
    (what was produced there). Returns the rows checked and the first ``limit`` mismatches;
    a row at coordinates nobody produced is a mismatch too."""
    checked = 0
    errors: list[str] = []
    wanted = ["_topic", "_partition", "_offset", *columns]
    for seg in store.segments(source):
        for uri in seg["files"]:
            filesystem, path = segment_store.filesystem(uri)
            rows = pq.read_table(path, columns=wanted, filesystem=filesystem).to_pylist()
            for row in rows:
                checked += 1
                want = expected(row["_topic"], row["_partition"], row["_offset"])
                coord = f"{row['_topic']}[{row['_partition']}]@{row['_offset']}"
                if want is None:
                    if len(errors) < limit:
                        errors.append(f"{coord}: not produced")
                    continue
                for column in columns:
                    if row[column] != want[column] and len(errors) < limit:
                        errors.append(f"{coord}: {column} is {row[column]!r}, produced {want[column]!r}")
    return checked, errors


@dataclass(frozen=True)
class StoreShape:
    """A source's current segments and the data files they list, as the store has them."""

    segments: int
    rows: int
    file_sizes: list[int]
    rejects_files: int

    @property
    def files(self) -> int:
        return len(self.file_sizes)

    @property
    def bytes(self) -> int:
        return sum(self.file_sizes)


def store_shape(store: Metastore, source: str) -> StoreShape:
    """Segments, rows and data file sizes read from the files themselves (what small files cost
    a reader), not from the metastore's accounting; before and after ``ingest compact``."""
    segments = store.segments(source)
    sizes: list[int] = []
    for seg in segments:
        for uri in seg["files"]:
            filesystem, path = segment_store.filesystem(uri)
            sizes.append(int(filesystem.get_file_info(path).size or 0))
    return StoreShape(
        segments=len(segments),
        rows=sum(int(seg["row_count"]) for seg in segments),
        file_sizes=sizes,
        rejects_files=sum(len(seg["rejects_files"]) for seg in segments),
    )


def published_positions(store: Metastore, source: str) -> dict[Coord, int | None]:
    return {(r["topic"], r["partition"]): r["next_offset"] for r in store.partitions(source)}


def verify_epochs(store: Metastore, source: str, ends: dict[Coord, int]) -> Verification:
    """Exactly once per epoch, for sources that were reset (``ingest reset``).

    A reset of a partition ends its epoch: the epoch's segments are those published up to the
    reset's ``last_segment_id``; the next epoch starts at the reset's new offset. Within each
    epoch every offset of ``[start, end)`` (``end``: the stored offset at the next reset, or
    the log end ``ends[coord]`` for the last epoch) is in exactly one published file and the
    ranges tile it without gap or overlap; a replayed offset thus appears once per epoch.
    Offsets are those produced densely from 0 (delivery reports), as the test harness does.
    """
    result = Verification()
    # Per partition, in reset order: (last segment id of the epoch it ends, new offset, old offset).
    bounds: dict[Coord, list[tuple[int, int, int | None]]] = {}
    for reset in reversed(store.recent_resets(source, limit=10_000)):
        for p in reset["partitions"]:
            bounds.setdefault((p["topic"], p["partition"]), []).append(
                (p["last_segment_id"] or 0, p["new_offset"], p["old_offset"])
            )
    # Per partition and epoch: ranges and offsets seen.
    ranges: dict[tuple[Coord, int], list[tuple[int, int]]] = {}
    seen: dict[tuple[Coord, int], Counter[int]] = {}
    for seg in store.segments(source):
        result.segments += 1
        result.rows += int(seg["row_count"])
        result.rejects += int(seg["rejects_count"])
        result.skipped += int(seg["skipped_count"])

        stored_epochs = {(r["topic"], r["partition"]): int(r["epoch"]) for r in seg["ranges"] if "epoch" in r}

        def epoch(coord: Coord, segment_id: int = int(seg["id"]), stored: dict[Coord, int] = stored_epochs) -> int:
            # The range's own epoch where listed: a compaction's segment keeps the epoch of the
            # ranges it replaced, while its id may be newer than a later reset's last segment.
            if coord in stored:
                return stored[coord]
            return sum(1 for last, _new, _old in bounds.get(coord, []) if segment_id > last)

        for uri in list(seg["files"]) + list(seg["rejects_files"]):
            for topic, partition, offset in read_coordinates(uri):
                seen.setdefault(((topic, partition), epoch((topic, partition))), Counter())[offset] += 1
        for r in seg["ranges"]:
            coord = (r["topic"], r["partition"])
            ranges.setdefault((coord, epoch(coord)), []).append((r["start"], r["end"]))
    if result.skipped:
        result.offset_errors.append(f"{result.skipped} records were skipped (policy skip): not verifiable")
    stored = {(r["topic"], r["partition"]): r["next_offset"] for r in store.partitions(source)}
    for coord, end in ends.items():
        resets = bounds.get(coord, [])
        starts = [0] + [new for _last, new, _old in resets]
        stops = [old if old is not None else start for (_last, _new, old), start in zip(resets, starts, strict=False)]
        stops.append(end)
        for e, (start, stop) in enumerate(zip(starts, stops, strict=True)):
            key = (coord, e)
            label = (f"{coord[0]}@epoch{e}", coord[1])
            got = seen.get(key, Counter())
            want = set(range(start, stop))
            if missing := sorted(want - set(got)):
                result.missing[label] = missing
            if dup := sorted(o for o, n in got.items() if n > 1):
                result.duplicates[label] = dup
            if extra := sorted(set(got) - want):
                result.unexpected[label] = extra
            position = start
            for lo, hi in sorted(ranges.get(key, [])):
                if lo != position:
                    result.range_errors.append(f"{coord} epoch {e}: range [{lo}, {hi}) does not start at {position}")
                position = hi
            if position != stop:
                result.range_errors.append(f"{coord} epoch {e}: ranges end at {position}, expected {stop}")
        if end and stored.get(coord) != end:
            result.offset_errors.append(f"{coord}: stored next_offset {stored.get(coord)} != log end {end}")
    return result
