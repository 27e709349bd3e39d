"""``ingest table-enable``: record that a source feeds Iceberg tables (the tables themselves are
created by the committer with its first commit). A source whose spec names a catalog of its own
(``[table] catalog``) has it opened first: one that does not answer is one line, nothing
enabled."""

from __future__ import annotations

from ingest.spec.model import SourceSpec
from ingest.table.config import PartitionBy, RejectsMode
from ingest_common.errors import ConfigError
from metastore.tables import TableKind, TableStore


def enable_table(
    database_url: str, source: str, partition_by: PartitionBy | None, rejects: RejectsMode
) -> list[tuple[TableKind, bool]]:
    """Record that the source feeds a data table (and a rejects table): [(kind, newly enabled)].
    The tables themselves are created by the committer with its first commit. The partition
    transform defaults to the spec's ``file_partition``; one the spec's files do not lie within
    is refused, since every file they hold would be refused at commit."""
    with TableStore(database_url) as store:
        spec = SourceSpec.from_json(store.latest_spec(source))
        cut = spec.file_partition
        partition_by = cut if partition_by is None else partition_by
        if not cut.covers(partition_by):
            raise ConfigError(
                f"--partition-by {partition_by.value}: source {source!r} cuts its data files by "
                f"{cut.value} (file_partition in its spec), so a file can span several {partition_by.value} "
                f'partitions; apply the spec with file_partition = "{partition_by.value}" (or finer) first'
            )
        if spec.table.external:
            from ingest.table.catalog import close_catalog, open_catalog

            close_catalog(open_catalog(database_url, spec.table))  # CatalogUnavailable: one line
        done = [(TableKind.DATA, store.enable(source, TableKind.DATA, partition_by.value))]
        if rejects is RejectsMode.TABLE:
            done.append((TableKind.REJECTS, store.enable(source, TableKind.REJECTS, PartitionBy.NONE.value)))
        return done
