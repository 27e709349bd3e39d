"""Which split each Parquet file of a batch build belongs to, read from the file footers.

A batch job reads each split's offsets from Kafka as one task of its own
(ingest.builder.kafka_read) and writes its output files into one directory, so every output
file holds rows of exactly one split. The footers prove it: a file's ``_topic`` and ``_partition`` are
constant and its ``_offset`` range lies inside one split's ``[start, end)``. A file that
does not is a BuildError, never a guess. A compaction (ingest.compact) checks its output the
same way, against the one range its new segment covers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow.parquet as pq

from ingest.errors import BuildError
from ingest.segments import store as segment_store
from ingest_common.model import TopicPartition


class Bounds(Protocol):
    """What files are attributed to: a sealed split, or a compaction's new segment."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def tp(self) -> TopicPartition: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


# The meta columns that place a row in the log: its footers say which split a file holds.
OFFSET_COLUMNS = ("_topic", "_partition", "_offset")


@dataclass(frozen=True, slots=True)
class OutputFile:
    uri: str
    size_bytes: int
    rows: int
    min_offset: int
    max_offset: int
    # Microseconds since the epoch; only for data files (the event-time column's range).
    min_event_us: int | None = None
    max_event_us: int | None = None


def attribute(
    dir_uri: str, splits: Sequence[Bounds], event_time: str | None = None
) -> dict[uuid.UUID, list[OutputFile]]:
    """The non-empty files of ``dir_uri`` by split id (empty files are deleted: Spark writes
    one to carry the schema when a job outputs no rows at all)."""
    by_tp: dict[tuple[str, int], list[Bounds]] = {}
    for split in splits:
        by_tp.setdefault((split.tp.topic, split.tp.partition), []).append(split)
    out: dict[uuid.UUID, list[OutputFile]] = {split.id: [] for split in splits}
    fs, _ = segment_store.filesystem(dir_uri)
    for uri, size in segment_store.list_files(dir_uri):
        _, path = segment_store.filesystem(uri)
        with fs.open_input_file(path) as handle:
            meta = pq.read_metadata(handle)
        if meta.num_rows == 0:
            segment_store.delete(uri)
            continue
        stats = column_ranges(meta, uri, (*OFFSET_COLUMNS, *([event_time] if event_time else [])))
        topic, partition, offsets = stats["_topic"], stats["_partition"], stats["_offset"]
        if topic[0] != topic[1] or partition[0] != partition[1]:
            raise BuildError(
                f"output file {uri} mixes partitions ({topic}, {partition}): a task read more than one split"
            )
        owner = next(
            (
                s
                for s in by_tp.get((str(topic[0]), int(partition[0])), ())
                if s.start <= int(offsets[0]) and int(offsets[1]) < s.end
            ),
            None,
        )
        if owner is None:
            raise BuildError(
                f"output file {uri} (offsets {offsets[0]}..{offsets[1]} of {topic[0]}/{partition[0]}) "
                "lies in no split of the batch"
            )
        event = stats.get(event_time) if event_time else None
        out[owner.id].append(
            OutputFile(
                uri=uri,
                size_bytes=size,
                rows=meta.num_rows,
                min_offset=int(offsets[0]),
                max_offset=int(offsets[1]),
                min_event_us=None if event is None else int(event[0]),
                max_event_us=None if event is None else int(event[1]),
            )
        )
    return out


def column_ranges(meta: pq.FileMetaData, uri: str, names: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """(min, max) of top-level columns over every row group; event-time columns as raw
    INT64 microseconds (the session writes TIMESTAMP_MICROS)."""
    first = meta.row_group(0)
    index = {first.column(i).path_in_schema: i for i in range(first.num_columns)}
    ranges: dict[str, tuple[Any, Any]] = {}
    for name in names:
        if name not in index:
            raise BuildError(f"output file {uri} has no column {name!r}")
        lows, highs = [], []
        for rg in range(meta.num_row_groups):
            column = meta.row_group(rg).column(index[name])
            st = column.statistics
            if column.num_values == 0 or (st is not None and st.null_count == column.num_values):
                continue
            if st is None or not st.has_min_max:
                raise BuildError(f"output file {uri} has no statistics for {name!r}")
            raw = name not in OFFSET_COLUMNS
            if raw and st.physical_type != "INT64":
                raise BuildError(f"output file {uri}: {name!r} is {st.physical_type}, expected INT64 micros")
            lows.append(st.min_raw if raw else st.min)
            highs.append(st.max_raw if raw else st.max)
        if not lows:
            raise BuildError(f"output file {uri} has rows but no values in {name!r}")
        ranges[name] = (min(lows), max(highs))
    return ranges


def read_metadata(uri: str) -> pq.FileMetaData:
    """A Parquet file's footer (no data read); OSError when it cannot be read."""
    fs, path = segment_store.filesystem(uri)
    with fs.open_input_file(path) as handle:
        return pq.read_metadata(handle)
