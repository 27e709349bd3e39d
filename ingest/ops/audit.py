"""``ingest audit``: the proof, from what the metastore and the store hold now, that every
offset of every partition is in exactly one current segment or one skipped gap.

From the metastore alone, per partition and epoch: the current segments' ranges and the
skipped gaps of that epoch tile ``[start, end)`` with no hole and no overlap. Epoch 0 starts
at the offset the partition's first claim pinned (``ingest_partitions.start_offset``), epoch
N > 0 at its N-th reset's ``new_offset``; an epoch ends at the next reset's ``old_offset``,
the current one at ``next_offset`` (migrations/0013_audit.sql). A segment never claims more
records (rows, rejects, skipped) than the offsets its ranges cover; one that records its holes
(the offsets with no record: transaction markers, aborted records, compacted-away offsets;
migrations/0028_segment_holes.sql) accounts for each offset exactly: records + holes = the
offsets covered. The holes are totalled in the report.

With ``files``: every data and rejects file a current segment lists exists, the row counts
of its footers add up to the segment's ``row_count`` / ``rejects_count``, and each file's
``_topic`` / ``_partition`` / ``_offset`` lie inside one of the segment's ranges (from the
footers' statistics; a file spanning partitions is read, three columns).

Which segments are current is said in one place: the ``current_segments`` query
(metastore/queries.sql). The Iceberg tables are checked by ``ingest.table.audit`` against the
same segments. Every finding is one line; the result of each audit is stored
(``ingest_audits``) and workers export the newest as metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pyarrow.parquet as pq

from ingest.errors import BuildError
from ingest.segments import output_files
from ingest.segments import store as segment_store
from metastore import Metastore
from metastore.audits import AuditSnapshot
from metastore.base import Row

# How many finding lines an audit's record keeps (the counts by kind are complete).
RECORDED_LINES = 20


class FindingKind(StrEnum):
    HOLE = "hole"  # offsets in no current segment and no skipped gap
    OVERLAP = "overlap"  # offsets in two current segments (or a segment and a skipped gap)
    OUTSIDE = "outside"  # a range or gap outside its epoch's [start, end), or in no known epoch
    EPOCHS = "epochs"  # the reset ledger disagrees with the partition's epoch, or an epoch has no start
    RECORDS = "records"  # a segment claims more records than its ranges cover, or records + holes differ from them
    MISSING_FILE = "missing_file"
    UNREADABLE_FILE = "unreadable_file"
    ROW_COUNT = "row_count"  # the footers' rows differ from the segment's count
    FILE_OFFSETS = "file_offsets"  # a file's rows lie outside the segment's ranges
    TABLE_MISSING = "table_missing_file"
    TABLE_EXTRA = "table_extra_file"
    TABLE_DUPLICATE = "table_duplicate_file"
    TABLE_DUPLICATE_ROWS = "table_duplicate_rows"  # a table holds a replaced segment and its replacement
    TABLE_DELETE_FILE = "table_delete_file"  # a delete file hides rows of a table's files
    TABLE_REFUSED = "table_refused_segment"  # a table cannot take a pending segment's files (pending, retried)
    UPSERT_OFFSETS = "upsert_offsets"  # an upsert table merged offsets nobody published, or disagrees with its record
    UPSERT_DUPLICATE_KEY = "upsert_duplicate_key"  # a key has two rows in an upsert table
    CROSS_PARTITION_KEYS = "cross_partition_keys"  # keys seen on two partitions: their order is undefined


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    where: str
    detail: str

    def line(self) -> str:
        return f"{self.kind.value}: {self.where}: {self.detail}"

    def document(self) -> dict[str, str]:
        return {"kind": self.kind.value, "where": self.where, "detail": self.detail, "line": self.line()}


@dataclass(slots=True)
class AuditResult:
    source: str
    started_at: datetime
    files: bool
    partitions: int = 0
    segments: int = 0
    files_read: int = 0
    # The current segments' holes (offsets with no record), and how many segments record none
    # (published by an earlier release).
    holes: int = 0
    holes_unrecorded: int = 0
    tables: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind.value for f in self.findings).items()))

    def summary(self) -> str:
        checked = f"{self.partitions} partition(s), {self.segments} segment(s)"
        if self.files:
            checked += f", {self.files_read} file(s)"
        if self.tables:
            checked += f", table(s) {', '.join(self.tables)}"
        verdict = "OK" if self.ok else f"{len(self.findings)} finding(s)"
        # Holes: offsets with no record (transaction markers, aborted records, compacted away).
        holes = f"{self.holes} hole(s)"
        if self.holes_unrecorded:
            holes += f", {self.holes_unrecorded} segment(s) with none recorded"
        return f"audit {self.source}: {verdict} ({checked}); {holes}"

    def document(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ok": self.ok,
            "started_at": self.started_at,
            "files": self.files,
            "tables": self.tables,
            "partitions": self.partitions,
            "segments": self.segments,
            "files_read": self.files_read,
            "holes": self.holes,
            "holes_unrecorded": self.holes_unrecorded,
            "by_kind": self.by_kind(),
            "findings": [f.document() for f in self.findings],
        }


def audit_source(store: Metastore, source: str, *, files: bool = False) -> tuple[AuditResult, AuditSnapshot]:
    """The metastore's (and with ``files`` the store's) findings; also returns the snapshot it
    audited, for the tables' audit. Reads one consistent snapshot of the metastore (one
    REPEATABLE READ transaction), so publishes running meanwhile are not half-seen."""
    store.latest_spec(source)  # SourceNotFound for an unknown source
    result = AuditResult(source, datetime.now(UTC), files)
    snapshot = store.audit_snapshot(source)
    partitions, segments, gaps = snapshot.partitions, snapshot.segments, snapshot.gaps
    result.partitions, result.segments = len(partitions), len(segments)
    result.holes = sum(int(s["holes"]) for s in segments if s["holes"] is not None)
    result.holes_unrecorded = sum(1 for s in segments if s["holes"] is None)
    result.findings += tiling_findings(partitions, segments, gaps)
    result.findings += record_findings(segments)
    result.findings += refused_findings(source, snapshot.refused)
    if files:
        for segment in segments:
            result.findings += file_findings(segment, result)
    return result, snapshot


def record_result(store: Metastore, result: AuditResult) -> None:
    """Store the audit's result (the metrics workers export read the newest). Nothing is
    logged: the command's output is its report (a log line would break ``--json``)."""
    store.record_audit(
        result.source,
        started_at=result.started_at,
        files=result.files,
        tables=bool(result.tables),
        partitions=result.partitions,
        segments=result.segments,
        files_read=result.files_read,
        by_kind=result.by_kind(),
        first_lines=[f.line() for f in result.findings[:RECORDED_LINES]],
    )


def refused_findings(source: str, refused: Sequence[Row]) -> list[Finding]:
    """Each pending segment a table of the source refused (ingest.table.refusals): the table
    lacks its records until the committer can take it."""
    return [
        Finding(
            FindingKind.TABLE_REFUSED,
            f"{r['kind']} table of {source} segment {r['segment_id']}",
            f"the table cannot take its files ({r['attempts']} attempt(s) since {r['first_at'].isoformat()}): "
            f"{r['error']}; it stays pending (the table lacks its records), retried by the committer",
        )
        for r in refused
    ]


# -- the metastore: tiling ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Piece:
    start: int
    end: int
    label: str


def _where(topic: str, partition: int, epoch: int) -> str:
    return f"{topic}[{partition}] epoch {epoch}"


def _epoch_bounds(p: Row) -> tuple[list[tuple[int | None, int | None]], list[Finding]]:
    """[start, end) of each epoch 0..current; None where the ledger records no bound."""
    starts: list[int | None] = [p["start_offset"], *p["starts"]]
    ends: list[int | None] = [*p["ends"], p["next_offset"]]
    findings = []
    if len(starts) != int(p["epoch"]) + 1:
        findings.append(
            Finding(
                FindingKind.EPOCHS,
                f"{p['topic']}[{p['partition']}]",
                f"the partition is in epoch {p['epoch']} but {len(starts) - 1} reset(s) changed it",
            )
        )
    return list(zip(starts, ends, strict=True)), findings


def tiling_findings(partitions: Sequence[Row], segments: Sequence[Row], gaps: Sequence[Row]) -> list[Finding]:
    """Holes, overlaps and strays of every (partition, epoch)."""
    pieces: dict[tuple[str, int, int], list[_Piece]] = {}
    for s in segments:
        for r in s["ranges"]:
            key = (r["topic"], int(r["partition"]), int(r["epoch"]))
            pieces.setdefault(key, []).append(_Piece(int(r["start"]), int(r["end"]), f"segment {s['id']}"))
    for g in gaps:
        if g["skipped"]:
            key = (g["topic"], int(g["partition"]), int(g["epoch"]))
            pieces.setdefault(key, []).append(_Piece(int(g["from_offset"]), int(g["to_offset"]), f"gap {g['id']}"))
    findings: list[Finding] = []
    for p in partitions:
        bounds, epoch_findings = _epoch_bounds(p)
        findings += epoch_findings
        for epoch, (start, end) in enumerate(bounds):
            key = (p["topic"], int(p["partition"]), epoch)
            findings += _tile(_where(*key), start, end, sorted(pieces.pop(key, []), key=lambda x: (x.start, x.end)))
    for (topic, partition, epoch), stray in sorted(pieces.items()):
        for piece in stray:
            findings.append(
                Finding(
                    FindingKind.OUTSIDE,
                    _where(topic, partition, epoch),
                    f"{piece.label} [{piece.start}, {piece.end}) lies in an epoch the partition never had",
                )
            )
    return findings


def _tile(where: str, start: int | None, end: int | None, pieces: Sequence[_Piece]) -> Iterator[Finding]:
    if start is None or end is None:
        if pieces:
            yield Finding(
                FindingKind.EPOCHS,
                where,
                f"the epoch has no recorded {'start' if start is None else 'end'} but holds "
                + ", ".join(f"{x.label} [{x.start}, {x.end})" for x in pieces),
            )
        return
    if end < start:
        yield Finding(FindingKind.EPOCHS, where, f"the epoch ends at {end}, before its start {start}")
        return
    cursor, last = start, "the epoch's start"
    for piece in pieces:
        if piece.start < start:
            yield Finding(
                FindingKind.OUTSIDE,
                where,
                f"{piece.label} [{piece.start}, {piece.end}) starts before the epoch's start {start}",
            )
        elif piece.start > cursor:
            yield Finding(
                FindingKind.HOLE, where, f"offsets [{cursor}, {piece.start}) are in no segment and no skipped gap"
            )
        elif piece.start < cursor:
            yield Finding(
                FindingKind.OVERLAP,
                where,
                f"offsets [{piece.start}, {min(cursor, piece.end)}) are in {piece.label} and in {last}",
            )
        if piece.end > cursor:
            cursor, last = piece.end, piece.label
    if cursor < end:
        yield Finding(FindingKind.HOLE, where, f"offsets [{cursor}, {end}) are in no segment and no skipped gap")
    elif cursor > end:
        yield Finding(FindingKind.OUTSIDE, where, f"{last} reaches {cursor}, past the epoch's end {end}")


def record_findings(segments: Iterable[Row]) -> Iterator[Finding]:
    """A segment's rows, rejects and skipped records each take one offset its ranges cover;
    with its holes recorded, they and the holes take every one."""
    for s in segments:
        covered = sum(int(r["end"]) - int(r["start"]) for r in s["ranges"])
        records = int(s["row_count"]) + int(s["rejects_count"]) + int(s["skipped_count"])
        counts = f"{s['row_count']} row(s) + {s['rejects_count']} reject(s) + {s['skipped_count']} skipped"
        holes = s["holes"]
        if not s["ranges"]:
            yield Finding(FindingKind.OUTSIDE, f"segment {s['id']}", "the segment has no offset range")
        elif records > covered:
            yield Finding(
                FindingKind.RECORDS,
                f"segment {s['id']}",
                f"{counts} = {records} record(s) in ranges covering {covered} offset(s)",
            )
        elif holes is not None and records + int(holes) != covered:
            yield Finding(
                FindingKind.RECORDS,
                f"segment {s['id']}",
                f"{counts} + {holes} hole(s) = {records + int(holes)} offset(s) in ranges covering {covered}",
            )


# -- the store: files -------------------------------------------------------------------


def file_findings(segment: Row, result: AuditResult) -> list[Finding]:
    """The segment's data and rejects files against its counts and ranges."""
    findings: list[Finding] = []
    for kind, uris, expected in (
        ("data", segment["files"], segment["row_count"]),
        ("rejects", segment["rejects_files"], segment["rejects_count"]),
    ):
        rows = 0
        complete = True
        for uri in uris:
            result.files_read += 1
            read = _file(segment, uri)
            if isinstance(read, Finding):
                findings.append(read)
                complete = False
                continue
            rows += read[0]
            findings += read[1]
        if complete and rows != int(expected):
            findings.append(
                Finding(
                    FindingKind.ROW_COUNT,
                    f"segment {segment['id']}",
                    f"its {len(uris)} {kind} file(s) hold {rows} row(s), the segment says {expected}",
                )
            )
    return findings


def _file(segment: Row, uri: str) -> tuple[int, list[Finding]] | Finding:
    """(rows, offset findings) of one file, or the finding that it is missing or unreadable."""
    where = f"segment {segment['id']} file {uri}"
    try:
        if not segment_store.exists(uri):
            return Finding(FindingKind.MISSING_FILE, where, "listed by the segment, not in the store")
        meta = output_files.read_metadata(uri)
        if meta.num_rows == 0:
            return 0, []
        stats = output_files.column_ranges(meta, uri, output_files.OFFSET_COLUMNS)
        if stats["_topic"][0] == stats["_topic"][1] and stats["_partition"][0] == stats["_partition"][1]:
            low, high = stats["_offset"]
            spans = [(str(stats["_topic"][0]), int(stats["_partition"][0]), int(low), int(high))]
        else:
            spans = _spans(uri)
    except (OSError, ValueError, BuildError) as exc:
        return Finding(FindingKind.UNREADABLE_FILE, where, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    ranges = [(r["topic"], int(r["partition"]), int(r["start"]), int(r["end"])) for r in segment["ranges"]]
    findings = [
        Finding(
            FindingKind.FILE_OFFSETS,
            where,
            f"its rows of {topic}[{partition}] hold offsets {low}..{high}, in no range of the segment ("
            + ", ".join(f"{t}[{n}] [{a}, {b})" for t, n, a, b in ranges)
            + ")",
        )
        for topic, partition, low, high in spans
        if not any(t == topic and n == partition and a <= low and high < b for t, n, a, b in ranges)
    ]
    return meta.num_rows, findings


def _spans(uri: str) -> list[tuple[str, int, int, int]]:
    """(topic, partition, lowest offset, highest offset) per partition a file holds rows of,
    read from its three offset columns (a file that spans partitions: statistics cannot say)."""
    fs, path = segment_store.filesystem(uri)
    with fs.open_input_file(path) as handle:
        table = pq.read_table(handle, columns=list(output_files.OFFSET_COLUMNS))
    grouped = table.group_by(["_topic", "_partition"]).aggregate([("_offset", "min"), ("_offset", "max")])
    # pyarrow names the aggregates <column>_<function>.
    return [
        (str(row["_topic"]), int(row["_partition"]), int(row["_offset_min"]), int(row["_offset_max"]))
        for row in grouped.to_pylist()
    ]
