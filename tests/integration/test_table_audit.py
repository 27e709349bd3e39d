"""``ingest audit --files`` on a table whose data files are those of the segments the metastore
records it holds and which is still wrong, against a real PostgreSQL, pyiceberg and Spark with
Iceberg's Java runtime: a replaced segment held beside its replacement (their records twice); a
delete file another engine added hides rows; a file of a replaced segment the table still holds
is gone from the store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.properties import COMMIT_REPLACED, COMMIT_SEGMENTS, COMMIT_SEQ
from ingest_dev.iceberg_spark import catalog_conf, spark_table
from metastore.tables import TableKind
from tests.integration.iceberg_harness import Source, audit_findings, committer, compact, table_offsets

# Iceberg's reserved field ids of a position delete file's columns.
DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)


@pytest.fixture
def src(database_url: str, tmp_path: Path) -> Iterator[Source]:
    source = Source(database_url, f"file://{tmp_path}/store")
    yield source
    source.store.close()


def test_the_audit_reports_a_replaced_segment_held_beside_its_replacement(database_url: str, src: Source) -> None:
    """What a committer that appended a replacement beside the segments it replaced left: the
    table holds their rows twice, and the metastore records all three as held. The replaced
    ones are no committer being behind: the audit says so."""
    a, b = src.publish(3), src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
        new = compact(src, [a, b])
        # The two writes of a plain append of the replacement, as commit 2.
        table = c.load(TableKind.DATA)
        assert table is not None
        (files,) = [s["files"] for s in src.store.segments(src.name) if s["id"] == new]
        txn = table.transaction()
        txn.add_files(files, check_duplicate_files=False)
        txn.set_properties({COMMIT_SEQ: "2", COMMIT_SEGMENTS: str(new), COMMIT_REPLACED: ""})
        snapshot = txn.commit_transaction().current_snapshot()
        assert snapshot is not None
        c.store.record_commit(src.name, TableKind.DATA, 2, [new], snapshot.snapshot_id, datetime.now(UTC))
    assert Counter(Counter(table_offsets(database_url, src.name)).values()) == {2: 6}
    name = f"ingest.{src.name}"
    assert audit_findings(database_url, src.name) == [
        f"table_duplicate_rows: table {name} segment {old}: replaced by segment {new}, which the table "
        "holds too: the table holds their records twice"
        for old in (a, b)
    ]


def test_the_audit_reports_a_delete_file_another_engine_committed(
    database_url: str, src: Source, tmp_path: Path, spark: Any
) -> None:
    src.publish(5)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
    assert audit_findings(database_url, src.name) == []
    (data_file,) = src.store.segments(src.name)[0]["files"]
    deletes = tmp_path / "deletes.parquet"
    pq.write_table(pa.table({"file_path": [data_file] * 2, "pos": [0, 1]}, DELETE_SCHEMA), deletes)
    # Iceberg's Java API (Spark's runtime, through its JdbcCatalog on the metastore) commits a
    # row delta of that position delete file: rows 0 and 1 of the data file are deleted.
    session = spark.newSession()
    for key, value in catalog_conf(database_url).items():
        session.conf.set(key, value)
    name = spark_table(src.name)
    session.table(name)  # resolves the catalog in the session (a py4j call alone does not see it)
    jvm = spark._jvm
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session._jsparkSession, name)
    delete_file = (
        jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(table.spec())
        .ofPositionDeletes()
        .withPath(deletes.as_uri())
        .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(deletes.stat().st_size)
        .withRecordCount(2)
        .build()
    )
    table.newRowDelta().addDeletes(delete_file).commit()
    assert table_offsets(database_url, src.name) == [2, 3, 4]  # the delete file hides two rows
    assert audit_findings(database_url, src.name) == [
        f"table_delete_file: table ingest.{src.name} file {deletes.as_uri()}: a position delete file hides rows of "
        "the table's data files (the committer writes none: another engine deleted rows)"
    ]


def test_the_audit_reports_a_missing_file_of_a_replaced_segment_the_table_holds(database_url: str, src: Source) -> None:
    a, b = src.publish(3), src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    with committer(database_url, src.name) as c:
        c.commit_all()
    (lost,) = next(s["files"] for s in src.store.segments(src.name) if s["id"] == a)
    compact(src, [a, b])  # the committer has not followed: the table holds a and b
    assert audit_findings(database_url, src.name) == []
    Path(lost.removeprefix("file://")).unlink()
    assert audit_findings(database_url, src.name) == [
        f"missing_file: table ingest.{src.name} file {lost}: listed by replaced segment {a}, which the table holds, "
        "not in the store: reading the table fails"
    ]
