"""The table's schema follows the segments' files: a new table takes the schema of its first
file, and a spec version that adds or widens columns evolves the table in the commit of the
first files that have them (Iceberg's name mapping resolves the columns Spark wrote without
field ids)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Transaction
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform, YearTransform

from ingest.segments.store import filesystem
from ingest.table.errors import SchemaChangeRefused
from ingest_common.errors import first_line
from ingest_common.model import PartitionBy
from metastore.tables import PendingSegment, TableKind

_TRANSFORMS: dict[PartitionBy, Transform[Any, Any]] = {
    PartitionBy.HOUR: HourTransform(),
    PartitionBy.DAY: DayTransform(),
    PartitionBy.MONTH: MonthTransform(),
    PartitionBy.YEAR: YearTransform(),
}


def transform_of(partition_by: PartitionBy) -> Transform[Any, Any] | None:
    """The Iceberg transform of the event time a table is partitioned by (None: unpartitioned)."""
    return _TRANSFORMS.get(partition_by)


def evolve(
    txn: Transaction,
    name: str,
    kind: TableKind,
    batch: Sequence[PendingSegment],
    checked: set[tuple[TableKind, int, int]],
) -> None:
    """Columns added by a spec version are added to the table (and to its name mapping);
    widening Iceberg allows (int -> long, float -> double) is applied; anything else stops
    the committer with one line rather than skip the segments. ``checked``: (table, spec
    version, table schema id) whose files' schema the table already covers."""
    seen: set[int] = set()
    for segment in batch:
        if segment.spec_version in seen:
            continue
        seen.add(segment.spec_version)
        if (kind, segment.spec_version, txn.table_metadata.current_schema_id) in checked:
            continue
        schema = file_schema(segment.files[0])
        try:
            with txn.update_schema() as update:
                update.union_by_name(schema)
        except Exception as exc:  # pyiceberg raises ValidationError, ValueError or ResolveError
            raise SchemaChangeRefused(
                f"table {name}: spec version {segment.spec_version} "
                f"changes the schema in a way Iceberg refuses: {first_line(exc)}"
            ) from exc
        checked.add((kind, segment.spec_version, txn.table_metadata.current_schema_id))


def file_schema(uri: str) -> pa.Schema:
    fs, path = filesystem(uri)
    return pq.read_schema(path, filesystem=fs).remove_metadata()
