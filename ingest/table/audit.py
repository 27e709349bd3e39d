"""``ingest audit``'s look at a source's Iceberg tables: each holds exactly the files of the
segments the metastore records it holds, each once.

What a table should hold comes from the audit's one snapshot of the metastore
(``metastore.audits.AuditSnapshot``): the segments recorded in ``ingest_table_segments`` and
not taken out by a replacement commit (``table_held``): current segments, and replaced ones
whose replacement the committer has not followed yet (it is behind, not wrong). Which state of
the table to compare: its current snapshot when the table's ``ingest.commit-seq`` is the
commit the metastore recorded (then anything else in it, a file added or removed outside the
committer, is a finding); otherwise the committer moved on since the snapshot was read (or
crashed between a commit and its record, which its reconcile settles), and the table is read
as of the Iceberg snapshot the metastore recorded with that commit. Per table:

- a file of a held segment that the table does not list: ``table_missing_file``;
- a file the table lists that no held segment lists (of the table's kind):
  ``table_extra_file``; a file it lists more than once: ``table_duplicate_file``.

- a held segment that a segment the table also holds replaced (directly or through
  replacements): ``table_duplicate_rows`` (their records are in the table twice);
- a delete file (position or equality deletes, which another engine may write; the committer
  writes none) in the table: ``table_delete_file`` (it hides rows of the held files);
- a file of a held replaced segment that is not in the store: ``missing_file`` (the current
  segments' files are checked by ``ingest.ops.audit``; readers of the table read these too).

A segment published but not committed yet is not a finding (the committer is behind). An upsert
source's data table holds no segment file: ``ingest.table.upsert_audit`` checks it instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.table.catalog import close_catalog, identifier, source_catalog
from ingest.table.committer import COMMIT_SEQ
from ingest.table.upsert_audit import upsert_findings
from ingest_common.errors import first_line
from metastore.audits import AuditSnapshot
from metastore.base import Row
from metastore.tables import TableKind, TableStore

# (kind, where, detail): ingest.ops.audit's FindingKind values (this layer does not import ops).
TableFinding = tuple[str, str, str]


def table_findings(database_url: str, source: str, snapshot: AuditSnapshot) -> tuple[list[str], list[TableFinding]]:
    """The source's tables checked (their kinds) and what is wrong with them; no table: nothing."""
    if not snapshot.tables:
        return [], []
    findings: list[TableFinding] = []
    with TableStore(database_url) as store:
        spec = SourceSpec.from_json(store.latest_spec(source))
    catalog = source_catalog(database_url, source)
    try:
        for row in snapshot.tables:
            kind = TableKind(row["kind"])
            if kind is TableKind.DATA and spec.table.upsert:
                # It holds no segment file: checked for its own invariants (ingest.table.upsert_audit).
                findings += upsert_findings(catalog, spec, row, snapshot.partitions)
                continue
            held = [h for h in snapshot.held if h["kind"] == kind.value]
            findings += _one_table(catalog, source, kind, row, held, snapshot.segments)
            findings += _held_twice(source, kind, snapshot.held_twice)
            findings += _replaced_files_missing(source, kind, held)
    finally:
        close_catalog(catalog)
    return [str(row["kind"]) for row in snapshot.tables], findings


@dataclass(frozen=True, slots=True)
class _TableState:
    """What the table's snapshot lists: its data files, and its delete files (path, content)."""

    data: list[str]
    deletes: list[tuple[str, DataFileContent]]


def _table_state(catalog: Catalog, source: str, kind: TableKind, recorded: Row) -> _TableState:
    try:
        table = catalog.load_table(identifier(source, kind))
    except NoSuchTableError:
        return _TableState([], [])
    snapshot_id = _recorded_state(table, recorded)
    if snapshot_id is None:
        return _TableState([], [])
    data = table.inspect.data_files(snapshot_id=snapshot_id).column("file_path").to_pylist()
    deletes = table.inspect.delete_files(snapshot_id=snapshot_id).select(["file_path", "content"]).to_pylist()
    return _TableState(
        [str(path) for path in data], [(str(d["file_path"]), DataFileContent(int(d["content"]))) for d in deletes]
    )


def _recorded_state(table: Table, recorded: Row) -> int | None:
    """The Iceberg snapshot that holds what the metastore recorded (None: no snapshot, no files)."""
    current = table.current_snapshot()
    if table.properties.get(COMMIT_SEQ, "0") == str(recorded["committed_seq"]) or current is None:
        return current.snapshot_id if current is not None else None
    wanted = recorded["last_snapshot_id"]
    if wanted is not None and table.snapshot_by_id(int(wanted)) is not None:
        return int(wanted)
    # Expired (the committer made more commits than it keeps snapshots since the audit read
    # the metastore): the current state, compared as it is.
    return current.snapshot_id


def _one_table(
    catalog: Catalog, source: str, kind: TableKind, recorded: Row, held_rows: list[Row], segments: list[Row]
) -> list[TableFinding]:
    name = ".".join(identifier(source, kind))
    column = "files" if kind is TableKind.DATA else "rejects_files"
    held = {uri: int(h["segment_id"]) for h in held_rows for uri in h["files"] or ()}
    current = {uri for s in segments for uri in s[column]}
    state = _table_state(catalog, source, kind, recorded)
    in_table = Counter(state.data)
    findings: list[TableFinding] = [
        (
            "table_delete_file",
            f"table {name} file {uri}",
            f"a {'position' if content is DataFileContent.POSITION_DELETES else 'equality'} delete file hides rows "
            "of the table's data files (the committer writes none: another engine deleted rows)",
        )
        for uri, content in sorted(state.deletes)
    ]
    for uri, segment in sorted(held.items()):
        if uri not in in_table:
            findings.append(
                (
                    "table_missing_file",
                    f"table {name} file {uri}",
                    f"segment {segment} is recorded as held by the table, which does not list this file",
                )
            )
    for uri, count in sorted(in_table.items()):
        if uri not in held:
            detail = (
                "listed by the table, by no segment the table is recorded as holding"
                if uri in current
                else "listed by the table, by no current segment"
            )
            findings.append(("table_extra_file", f"table {name} file {uri}", detail))
        if count > 1:
            findings.append(("table_duplicate_file", f"table {name} file {uri}", f"listed {count} times by the table"))
    return findings


def _held_twice(source: str, kind: TableKind, twice: list[Row]) -> list[TableFinding]:
    name = ".".join(identifier(source, kind))
    return [
        (
            "table_duplicate_rows",
            f"table {name} segment {r['segment_id']}",
            f"replaced by segment {r['replacement']}, which the table holds too: the table holds their records twice",
        )
        for r in twice
        if r["kind"] == kind.value
    ]


def _replaced_files_missing(source: str, kind: TableKind, held_rows: list[Row]) -> list[TableFinding]:
    """The files of the replaced segments the table holds (until its committer follows the
    replacement) that are not in the store."""
    name = ".".join(identifier(source, kind))
    findings: list[TableFinding] = []
    for h in held_rows:
        if h["current"]:
            continue  # ingest.ops.audit checks the current segments' files
        for uri in h["files"] or ():
            try:
                there = segment_store.exists(uri)
            except OSError as exc:
                findings.append(("unreadable_file", f"table {name} file {uri}", first_line(exc)))
                continue
            if not there:
                findings.append(
                    (
                        "missing_file",
                        f"table {name} file {uri}",
                        f"listed by replaced segment {h['segment_id']}, which the table holds, not in the store: "
                        "reading the table fails",
                    )
                )
    return findings
