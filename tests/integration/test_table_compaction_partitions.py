"""Compaction of a table-fed source whose old segments were cut coarser than the table's
partitioning, with real Spark, PostgreSQL and pyiceberg: the compacted files lie each in one
partition of the table, so the committer follows the replacement (it cannot register a file
spanning partitions and would stop at it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ingest.compact.job import Compactor
from ingest.spark.session import FixedSession
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from metastore.tables import TableKind
from tests.integration.iceberg_harness import Source, assert_exactly_once, audit_findings, committer, table_files


def test_compacting_segments_cut_coarser_than_the_table_cuts_by_the_tables_partitions(
    database_url: str, tmp_path: Path, spark: Any
) -> None:
    """Two segments written while the spec cut no files (each within one day, a day apart), then
    the spec cuts by day and the table is partitioned by day: both are appended. Compacting them
    (one spec version, contiguous) must not make one file of two days."""
    src = Source(database_url, f"file://{tmp_path}/store")
    try:
        old = [src.publish(3), src.publish(4, day=1)]
        src.file_partition = "day"
        src.apply()
        enable_table(database_url, src.name, PartitionBy.DAY, RejectsMode.NONE)
        with committer(database_url, src.name) as c:
            assert [r.segment_ids for r in c.commit_all()] == [tuple(old)]
            result = Compactor(src.store, lambda _spec: FixedSession(spark), "compact-test").run(src.name)
            assert [r.replaced for r in result.replaced] == [tuple(old)] and not result.refused
            (new,) = [r.segment_id for r in result.replaced]
            assert [(r.kind, r.segment_ids) for r in c.commit_all()] == [(TableKind.DATA, (new,))]
            (files,) = [s["files"] for s in src.store.segments(src.name) if s["id"] == new]
            assert len(files) == 2 and table_files(c) == set(files)
        assert_exactly_once(database_url, src)
        assert audit_findings(database_url, src.name) == []
    finally:
        src.store.close()
