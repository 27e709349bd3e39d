"""Which segments a compaction takes (ingest.compact.plan): contiguous runs of small segments
of one partition, epoch and spec version, cut near the target, never a rewrite that mostly
copies one big file again."""

from __future__ import annotations

from typing import Any

from ingest.compact.plan import choose, file_cut
from ingest_common.model import PartitionBy

MB = 1024**2


def seg(
    sid: int, start: int, end: int, size_mb: float, *, files: int = 1, partition: int = 0, epoch: int = 0,
    version: int = 1, ranges: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A row as Metastore.segments lists it."""
    return {
        "id": sid,
        "spec_version": version,
        "files": [f"file:///s/{sid}-{n}.parquet" for n in range(files)],
        "row_count": end - start,
        "size_bytes": int(size_mb * MB),
        "rejects_files": [],
        "ranges": ranges
        if ranges is not None
        else [{"topic": "t", "partition": partition, "start": start, "end": end, "epoch": epoch}],
    }


def ids(rows: list[dict[str, Any]], target_mb: int = 256) -> list[list[int]]:
    return [list(c.ids) for c in choose(rows, target_mb * MB)]


def test_a_run_of_small_segments_becomes_one_chunk_in_offset_order() -> None:
    rows = [seg(3, 20, 30, 1), seg(1, 0, 10, 1), seg(2, 10, 20, 1)]
    [chunk] = choose(rows, 256 * MB)
    assert (chunk.ids, chunk.start, chunk.end, chunk.rows) == ((1, 2, 3), 0, 30, 30)


def test_runs_break_at_gaps_big_segments_partitions_epochs_and_spec_versions() -> None:
    rows = [
        seg(1, 0, 10, 1), seg(2, 10, 20, 1),
        seg(3, 20, 30, 300),  # at the target: never rewritten, and it ends the run
        seg(4, 30, 40, 1), seg(5, 40, 50, 1),
        seg(6, 60, 70, 1), seg(7, 70, 80, 1),  # after a hole (a skipped gap)
        seg(8, 80, 90, 1, version=2), seg(9, 90, 100, 1, version=2),  # another schema
        seg(10, 0, 10, 1, partition=1),  # alone in its partition
        seg(11, 0, 10, 1, epoch=1), seg(12, 10, 20, 1, epoch=1),  # replayed after a reset
    ]  # fmt: skip
    assert ids(rows) == [[1, 2], [4, 5], [6, 7], [8, 9], [11, 12]]


def test_a_run_is_cut_near_the_target() -> None:
    rows = [seg(i, 10 * i, 10 * (i + 1), 30) for i in range(20)]  # 600 MB of 30 MB segments
    chunks = choose(rows, 100 * MB)
    assert [len(c.ids) for c in chunks] == [3, 3, 3, 3, 3, 3, 2]
    assert all(c.size_bytes <= 100 * MB for c in chunks)


def test_a_chunk_that_would_mostly_copy_one_file_again_starts_after_it() -> None:
    # An earlier compaction's 100 MB file and three new 1 MB segments: rewriting 103 MB to add
    # 3 is not worth it; the three new ones are compacted together. Below a sixteenth of the
    # target, copying again is cheap: merged all the same.
    rows = [seg(1, 0, 100, 100), seg(2, 100, 110, 1), seg(3, 110, 120, 1), seg(4, 120, 130, 1)]
    assert ids(rows) == [[2, 3, 4]]
    # Balanced sizes are merged.
    assert ids([seg(1, 0, 10, 50), seg(2, 10, 20, 50)]) == [[1, 2]]
    assert ids([seg(1, 0, 10, 15), seg(2, 10, 20, 1)]) == [[1, 2]]


def test_segments_without_files_join_runs_and_many_partitions_segments_are_left_alone() -> None:
    two = [
        {"topic": "t", "partition": 0, "start": 20, "end": 30, "epoch": 0},
        {"topic": "t", "partition": 1, "start": 0, "end": 5, "epoch": 0},
    ]
    rows = [seg(1, 0, 10, 0, files=0), seg(2, 10, 20, 1), seg(3, 20, 30, 1, ranges=two)]
    assert ids(rows) == [[1, 2]]
    # A segment of many small files is small; one big file is not.
    assert ids([seg(1, 0, 10, 400, files=8), seg(2, 10, 20, 10)]) == []
    assert ids([seg(1, 0, 10, 100, files=8), seg(2, 10, 20, 100, files=8)]) == [[1, 2]]


def test_compacted_files_are_cut_for_the_table_and_for_any_table_the_spec_allows() -> None:
    none, hour, day, month, year = (PartitionBy(v) for v in ("none", "hour", "day", "month", "year"))
    assert file_cut(none, none, day) is day  # the table's partitions, though no spec cuts that fine now
    assert file_cut(none, month, None) is month  # any table `ingest table-enable` accepts now
    assert file_cut(hour, day, day) is hour  # the files' own finer cut is kept
    assert file_cut(day, none, year) is day
    assert file_cut(none, none, None) is none
