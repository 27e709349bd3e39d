"""A segment replacement (compaction, migrations/0017) as one Iceberg commit: the files of the
segments the table holds that the new segment replaced go out, the new segment's files come
in, in one overwrite snapshot of the same rows (migrations/0019 records it).

The files to take out are named by the metastore (``PendingSegment.superseded_files``: the
replaced segments the table is recorded as holding); each must be in the table's current
snapshot, or the table and the metastore disagree and nothing is committed
(:class:`TableDiverged`). A file both lists (a rejects file a replacement carries as it is)
stays. A replacement that changes no file of the table (the rejects table, when every
replaced segment's rejects files are carried) is an overwrite snapshot that changes no file:
still one commit, recorded like any other, so the metastore's record and the table's
``ingest.commit-seq`` move together. It is a snapshot, not a change of properties alone,
because a catalog checks a commit against the table's branch head (pyiceberg asserts the head
a snapshot was built on) and applies a change of properties alone to whatever the table holds
by then: a stale one would set ``ingest.commit-seq`` back on a table that moved on.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table import Table, TableProperties, Transaction

from ingest.table.errors import TableDiverged, file_refused
from ingest.table.properties import COMMIT_REPLACED, COMMIT_SEGMENTS, COMMIT_SEQ
from metastore.tables import PendingSegment


def held_data_files(table: Table, paths: Iterable[str]) -> list[DataFile]:
    """The current snapshot's data files among ``paths`` (reads every data manifest once)."""
    wanted = set(paths)
    snapshot = table.current_snapshot()
    if not wanted or snapshot is None:
        return []
    found: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.file_path in wanted:
                found.append(entry.data_file)
    return found


def stage_replacement(txn: Transaction, table: Table, name: str, segment: PendingSegment, seq: int) -> tuple[int, int]:
    """Stage in ``txn`` (on ``table``, its state) commit ``seq``: the snapshot that takes the
    superseded files out and puts the segment's in (an empty one when no file changes), and
    the properties that say so; returns (files out, files in)."""
    replaced = ",".join(map(str, segment.supersedes))
    txn.set_properties({COMMIT_SEQ: str(seq), COMMIT_SEGMENTS: str(segment.id), COMMIT_REPLACED: replaced})
    summary = {COMMIT_SEQ: str(seq), "ingest.replacement": str(segment.id), COMMIT_REPLACED: replaced}
    keep = set(segment.files)
    out = sorted(set(segment.superseded_files) - keep)
    new = [f for f in segment.files if f not in set(segment.superseded_files)]
    if not out and not new:
        with txn.update_snapshot(snapshot_properties=summary).overwrite():
            pass  # no file out, none in: the snapshot moves the branch head
        return 0, 0
    old = held_data_files(table, out)
    if missing := sorted(set(out) - {f.file_path for f in old}):
        raise TableDiverged(
            f"table {name}: the metastore records segments {', '.join(map(str, segment.supersedes))} as held, "
            f"but the table does not list {len(missing)} of their files (first: {missing[0]}); nothing is replaced"
        )
    if new and txn.table_metadata.name_mapping() is None:
        # As add_files does: Spark writes no field ids, readers resolve columns by name.
        mapping = txn.table_metadata.schema().name_mapping.model_dump_json()
        txn.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
    try:
        added = [parquet_file_to_data_file(table.io, txn.table_metadata, uri) for uri in new]
    except (ValueError, ArithmeticError) as exc:
        raise file_refused(name, (segment.id,), exc) from exc
    with txn.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
        for data_file in old:
            overwrite.delete_data_file(data_file)
        for data_file in added:
            overwrite.append_data_file(data_file)
    return len(old), len(added)
