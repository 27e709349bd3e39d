"""Spark (the product's own, in the tests' session) reads exactly the committed rows of both
Iceberg tables through Iceberg's JdbcCatalog on the metastore's PostgreSQL, each once, the same rows
pyiceberg's scan reads."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest

from ingest.segments.store import filesystem
from ingest.table.catalog import close_catalog, identifier, source_catalog
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_dev.iceberg_spark import read_tables, spark_table
from ingest_dev.process import run_process
from metastore.tables import TableKind
from tests.fixtures.catalogs import CATALOGS, TableCatalog
from tests.integration.iceberg_harness import REPO, Source, committer


def table_coordinates(database_url: str, source: str, kind: TableKind) -> list[tuple[str, int, int]]:
    """Every row's (_topic, _partition, _offset) as pyiceberg's scan reads them, sorted."""
    catalog = source_catalog(database_url, source)
    try:
        rows = (
            catalog.load_table(identifier(source, kind))
            .scan(selected_fields=("_topic", "_partition", "_offset"))
            .to_arrow()
            .to_pylist()
        )
    finally:
        close_catalog(catalog)
    return sorted((r["_topic"], r["_partition"], r["_offset"]) for r in rows)


def file_rows(files: list[str]) -> list[tuple[str, str, int, int]]:
    """(file, _topic, _partition, _offset) of every row in the files, read with pyarrow, sorted."""
    rows = []
    for f in files:
        fs, path = filesystem(f)
        table = pq.read_table(path, filesystem=fs, columns=["_topic", "_partition", "_offset"])
        rows += [(f, r["_topic"], r["_partition"], r["_offset"]) for r in table.to_pylist()]
    return sorted(rows)


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_spark_reads_every_committed_row_once_through_icebergs_catalog(
    database_url: str, table_catalog: TableCatalog, spark: Any
) -> None:
    """Spark (the product's pyspark with Iceberg's runtime from the project's jar set, in a new
    session on the tests' SparkContext: ingest_dev/iceberg_spark.py) reads both tables through
    Iceberg's JdbcCatalog on the metastore's PostgreSQL (``sql``), or through Iceberg's REST
    catalog client and its S3FileIO (``rest``: Nessie, tables and segments on the S3 API): it
    sees exactly the rows of the committed segments' files, each once, the same rows
    pyiceberg's scan reads, and nothing of a segment published after the commit.

    Spark cannot select the column ``_partition`` (Iceberg reserves the name for its metadata
    column and refuses the scan), so it identifies each row by ``_file`` (Iceberg's metadata
    column: the data file it was read from), ``_topic`` and ``_offset``; the Kafka partition of
    each row is then that file's."""
    src = Source(database_url, table_catalog.store, partitions=2, catalog=table_catalog.catalog)
    try:
        src.publish(10)
        src.publish(6, rejects=2, partition=1)
        src.publish(0, holes=3)
        src.publish(7, partition=1)
        src.publish(5, rejects=1)
        enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.TABLE)
        with committer(database_url, src.name, batch=2) as c:
            assert c.commit_all()
        committed = src.store.segments(src.name)
        late = src.publish(4, partition=1)  # published, not committed: no reader of the table sees it yet
        late_files = {f for s in src.store.segments(src.name) if s["id"] == late for f in s["files"]}
        tables = {kind: spark_table(src.name, kind) for kind in TableKind}
        if table_catalog.catalog is None:
            seen = read_tables(database_url, list(tables.values()), coordinates=True, spark=spark)
        else:
            # A Spark of its own (Iceberg's S3FileIO cannot run beside the S3A connector's SDK),
            # so a process of its own: one SparkContext per process.
            conf = json.dumps({**table_catalog.catalog, **table_catalog.spark})
            reader = run_process(
                [
                    sys.executable,
                    "-m",
                    "ingest_dev.iceberg_spark",
                    "read",
                    "--both",
                    "--coordinates",
                    "--catalog",
                    conf,
                    src.name,
                ],
                capture_output=True,
                timeout=300,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                cwd=REPO,
            )
            assert reader.returncode == 0, reader.stderr[-3000:]
            seen = json.loads(reader.stdout)
    finally:
        src.store.close()
    assert seen["spark_version"] == spark.version  # the product's pyspark, either way
    for kind, files_key, count_key, partitions in (
        (TableKind.DATA, "files", "row_count", {("events", 0): 15, ("events", 1): 13}),
        (TableKind.REJECTS, "rejects_files", "rejects_count", {("events", 0): 1, ("events", 1): 2}),
    ):
        spark = seen["tables"][tables[kind]]
        assert set(spark["refused_columns"]) == {"_partition"}, spark["refused_columns"]
        assert spark["key"] == ["_topic", "_offset"]
        expected = file_rows([f for s in committed for f in s[files_key]])
        assert spark["rows"] == len(expected) == sum(s[count_key] for s in committed) == sum(partitions.values())
        assert spark["distinct_file_keys"] == spark["rows"]  # no row twice
        assert spark["files"] == len({f for f, *_ in expected})
        # Row for row the committed files' rows, each once: a row of another file (the late
        # segment's), a missing row or a row read twice would differ here.
        partition_of = {(f, t, o): p for f, t, p, o in expected}
        spark_rows = sorted((f, t, partition_of[(f, t, o)], o) for f, t, o in spark["coordinates"])
        assert spark_rows == expected
        assert not {f for f, *_ in spark_rows} & late_files
        coordinates = sorted((t, p, o) for _, t, p, o in spark_rows)
        assert coordinates == table_coordinates(database_url, src.name, kind)
        assert len(set(coordinates)) == len(coordinates)
        assert Counter((t, p) for t, p, _ in coordinates) == partitions
