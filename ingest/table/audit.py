"""``ingest audit``'s look at a source's Iceberg tables: each holds exactly the files of the
current segments the metastore records it holds, each once.

The current segments are the ones ``ingest.ops.audit`` read (the ``current_segments`` query),
so a table is checked against the same snapshot as the offsets. Per table of the source:

- a file of a current segment recorded as held (``ingest_table_segments``) that the table's
  current snapshot does not list: ``table_missing_file``;
- a file the table lists that no current segment lists (of the table's kind):
  ``table_extra_file``; a file it lists more than once: ``table_duplicate_file``.

A segment published but not committed yet is not a finding (the committer is behind); a
file of it already in the table neither (a commit not recorded yet: the committer's
reconcile records it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pyiceberg.exceptions import NoSuchTableError

from ingest.table.catalog import MetastoreCatalog, identifier
from metastore.base import Row
from metastore.tables import TableKind, TableStore

# (kind, where, detail): ingest.ops.audit's FindingKind values (this layer does not import ops).
TableFinding = tuple[str, str, str]


def table_findings(database_url: str, source: str, segments: Sequence[Row]) -> tuple[list[str], list[TableFinding]]:
    """The source's tables checked (their kinds) and what is wrong with them; no table: nothing."""
    with TableStore(database_url) as store:
        rows = store.tables(source)
    if not rows:
        return [], []
    findings: list[TableFinding] = []
    catalog = MetastoreCatalog(database_url)
    try:
        for row in rows:
            findings += _one_table(catalog, source, row.kind, segments)
    finally:
        catalog.close()
    return [row.kind.value for row in rows], findings


def _table_files(catalog: MetastoreCatalog, source: str, kind: TableKind) -> list[str]:
    try:
        table = catalog.load_table(identifier(source, kind))
    except NoSuchTableError:
        return []
    if table.current_snapshot() is None:
        return []
    return [str(path) for path in table.inspect.data_files().column("file_path").to_pylist()]


def _one_table(catalog: MetastoreCatalog, source: str, kind: TableKind, segments: Sequence[Row]) -> list[TableFinding]:
    name = ".".join(identifier(source, kind))
    column = "files" if kind is TableKind.DATA else "rejects_files"
    listed = {uri: int(s["id"]) for s in segments for uri in s[column]}
    held = {uri: int(s["id"]) for s in segments if kind.value in s["tables"] for uri in s[column]}
    in_table = Counter(_table_files(catalog, source, kind))
    findings: list[TableFinding] = []
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
        if uri not in listed:
            findings.append(
                ("table_extra_file", f"table {name} file {uri}", "listed by the table, by no current segment")
            )
        if count > 1:
            findings.append(("table_duplicate_file", f"table {name} file {uri}", f"listed {count} times by the table"))
    return findings
