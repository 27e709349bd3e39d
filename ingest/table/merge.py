"""An upsert table's merge in Spark: one batch of segments' changes applied to a branch of the
table with Iceberg's ``MERGE INTO`` (merge-on-read: position delete files, no rewrite of the
files a change touches), and the table's maintenance (the delete files folded back, snapshots
expired). The committer (ingest.table.upsert) decides which rows and makes the branch the
table's head; nothing here commits to ``main`` but the maintenance, which never changes a row.

The rows of a batch: per partition, the offsets ``[from, to)`` the committer gives, read from
the segments' Parquet files. Per key, the last change wins: within a partition the highest
offset (Kafka's order); across partitions, whose order Kafka does not define, the newest
Kafka timestamp, then the higher topic and partition, so that a batch is deterministic, and the
key is counted as a cross-partition key (reported in status and audit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import structlog

from ingest.spec.table import OP_COLUMN, OP_DELETE
from ingest.table.catalog import CATALOG_NAME
from ingest.table.spark_catalog import EXTENSIONS_CONF, catalog_conf, quoted, sql_string

log = structlog.get_logger(__name__)

# The Kafka partition's column in an upsert table: ``_partition`` is the name of one of
# Iceberg's metadata columns, which Iceberg's Spark scan (and so MERGE INTO) refuses to read.
TABLE_PARTITION_COLUMN = "_kafka_partition"
# A table's properties that make MERGE write position deletes instead of rewriting files.
MERGE_ON_READ = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
# The committer's own local session: small, Iceberg's SQL extensions, the metastore's catalog
# with no cache (a branch pyiceberg created a moment ago must be seen).
MERGE_SESSION_CONF = {
    **EXTENSIONS_CONF,
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "2",
    f"spark.sql.catalog.{CATALOG_NAME}.cache-enabled": "false",
}
_BATCH_VIEW = "ingest_upsert_batch"


@dataclass(frozen=True, slots=True)
class RowRange:
    """The offsets ``[start, end)`` of one partition a batch merges."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class MergeResult:
    # The branch's new head: the table at its base snapshot plus this batch's changes.
    snapshot_id: int
    parent_id: int | None
    # Keys changed, and of them those seen on more than one partition.
    keys: int
    cross_partition_keys: int


def activate(spark: Any) -> None:
    """Make ``spark`` the JVM's active session on this thread: Iceberg's actions and procedures
    run their jobs on ``SparkSession.active()``, which is otherwise the session the
    SparkContext was started with (another catalog setting, in a process that shares it)."""
    jvm = spark._jvm
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def merge_session_conf(database_url: str) -> dict[str, str]:
    return {**MERGE_SESSION_CONF, **catalog_conf(database_url)}


def open_merge_session(database_url: str, source: str, segment_store: str) -> tuple[Any, bool]:
    """The upsert merges' session and whether it is ours to stop: a new session (the catalog's
    settings its own) on this process's SparkContext, started here unless one runs already."""
    from pyspark import SparkContext

    from ingest.spark.start import create_session

    owned = SparkContext._active_spark_context is None
    conf = merge_session_conf(database_url)
    base = create_session("local[1]", f"ingest-upsert-{source}", conf, stores=[segment_store], connectors=True)
    session = base.newSession()
    for key, value in conf.items():
        if key.startswith("spark.sql.catalog."):
            session.conf.set(key, value)
    return session, owned


def batch_rows(spark: Any, files: Sequence[str], ranges: Sequence[RowRange]) -> Any:
    """The batch's changes as the table's columns plus ``_op``: the rows of ``ranges`` from
    ``files`` (any spec version's: columns a file lacks are null)."""
    from pyspark.sql import functions as F

    df = spark.read.option("mergeSchema", "true").parquet(*sorted(set(files)))
    wanted = None
    for r in ranges:
        cond = (
            (F.col("_topic") == F.lit(r.topic))
            & (F.col("_partition") == F.lit(r.partition))
            & (F.col("_offset") >= F.lit(r.start))
            & (F.col("_offset") < F.lit(r.end))
        )
        wanted = cond if wanted is None else wanted | cond
    assert wanted is not None, "a batch has at least one range"
    return df.where(wanted).withColumnRenamed("_partition", TABLE_PARTITION_COLUMN)


def last_changes(rows: Any, keys: Sequence[str]) -> Any:
    """Per key the change that wins (module docstring), with ``_cross``: whether the batch has
    the key on more than one partition."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key_cols = [F.col(quoted(k)) for k in keys]
    # A row without its key changes nothing (a Debezium tombstone whose key was not decoded).
    rows = rows.where(reduce(lambda a, b: a & b, (c.isNotNull() for c in key_cols)))
    in_partition = Window.partitionBy(*key_cols, F.col("_topic"), F.col(TABLE_PARTITION_COLUMN)).orderBy(
        F.col("_offset").desc()
    )
    across = Window.partitionBy(*key_cols)
    ordered = across.orderBy(F.col("_timestamp").desc(), F.col("_topic").desc(), F.col(TABLE_PARTITION_COLUMN).desc())
    last = rows.withColumn("_n", F.row_number().over(in_partition)).where(F.col("_n") == 1).drop("_n")
    return (
        last.withColumn("_cross", F.count(F.lit(1)).over(across) > 1)
        .withColumn("_n", F.row_number().over(ordered))
        .where(F.col("_n") == 1)
        .drop("_n")
    )


def merge_batch(
    spark: Any,
    table: str,
    branch: str,
    files: Sequence[str],
    ranges: Sequence[RowRange],
    keys: Sequence[str],
) -> MergeResult:
    """Apply the batch's changes to ``table``'s branch ``branch`` (created by the committer at
    the table's head): a key's winning change deletes its row (``_op`` "d") or becomes its row.
    ``table``: its name in Spark SQL, its parts quoted
    (ingest.table.spark_catalog.spark_table_name). Returns the branch's new head and what the
    batch held."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    activate(spark)
    target = f"{table}.{quoted('branch_' + branch)}"
    columns = [c for c in spark.table(target).columns]
    changes = last_changes(batch_rows(spark, files, ranges), keys).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        source_columns = set(changes.columns)
        missing = [k for k in keys if k not in source_columns]
        if missing:
            raise ValueError(f"the segments have no key column {missing[0]!r}")
        # Keys whose row in the table came from another partition: their order is undefined too.
        held = spark.table(target).select(
            *(F.col(quoted(k)).alias(f"_t_{k}") for k in keys),
            F.col("_topic").alias("_t_topic"),
            F.col(TABLE_PARTITION_COLUMN).alias("_t_partition"),
        )
        on = [changes[quoted(k)] == held[quoted(f"_t_{k}")] for k in keys]
        moved = (held["_t_topic"] != changes["_topic"]) | (held["_t_partition"] != changes[TABLE_PARTITION_COLUMN])
        counts = (
            changes.join(held, on, "left")
            .agg(
                F.count(F.lit(1)).alias("keys"),
                F.sum(F.when(F.col("_cross") | F.coalesce(moved, F.lit(False)), 1).otherwise(0)).alias("cross"),
            )
            .collect()[0]
        )
        changes.createOrReplaceTempView(_BATCH_VIEW)
        shared = [c for c in columns if c in source_columns]
        on_keys = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in keys)
        op, delete = f"s.{quoted(OP_COLUMN)}", sql_string(OP_DELETE)
        spark.sql(
            f"MERGE INTO {target} t USING {quoted(_BATCH_VIEW)} s ON {on_keys} "
            f"WHEN MATCHED AND {op} = {delete} THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{quoted(c)} = s.{quoted(c)}' for c in shared)} "
            f"WHEN NOT MATCHED AND {op} <> {delete} THEN INSERT ({', '.join(map(quoted, shared))}) "
            f"VALUES ({', '.join(f's.{quoted(c)}' for c in shared)})"
        )
        head = spark.sql(f"SELECT snapshot_id FROM {table}.`refs` WHERE name = {sql_string(branch)}").collect()
        snapshot_id = int(head[0]["snapshot_id"])
        parent = spark.sql(f"SELECT parent_id FROM {table}.`snapshots` WHERE snapshot_id = {snapshot_id:d}").collect()
        parent_id = parent[0]["parent_id"] if parent else None
    finally:
        changes.unpersist()
        spark.catalog.dropTempView(_BATCH_VIEW)
    parent = None if parent_id is None else int(parent_id)
    return MergeResult(snapshot_id, parent, int(counts["keys"]), int(counts["cross"] or 0))


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    delete_files_before: int
    rewritten_data_files: int
    removed_delete_files: int
    expired_files: int


def delete_files(spark: Any, table: str) -> int:
    """The delete files of the table's current snapshot."""
    return int(spark.sql(f"SELECT count(*) AS n FROM {table}.`delete_files`").collect()[0]["n"])


def maintain(
    spark: Any, table: str, keep_snapshots: int, options: Mapping[str, str] | None = None
) -> MaintenanceResult:
    """Fold the delete files the merges left back into the data files (``rewrite_data_files``
    of every file with a delete, then ``rewrite_position_delete_files`` for what is left), and
    expire all but the newest ``keep_snapshots`` snapshots, deleting the files only they held.
    Each step is one Iceberg commit onto ``main`` that changes no row; a merge the committer
    staged meanwhile is refused at its swap (its base is no longer the head) and redone."""
    activate(spark)
    # Whole: the namespace is named as the catalog is, and a procedure reads "ingest.x" as
    # table x of catalog ingest. A string the procedure parses as a name: its quotes stay.
    ident = sql_string(table)
    before = delete_files(spark, table)
    opts = {"delete-file-threshold": "1", "min-input-files": "1", **(options or {})}
    opts_sql = ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in opts.items())

    def call(procedure: str, arguments: str) -> Any:
        # Every name quoted, the arguments' too: ``table`` is a reserved word (and so is
        # ``current_timestamp``: hence now(), the same function).
        return spark.sql(f"CALL {quoted(CATALOG_NAME)}.`system`.{quoted(procedure)}({arguments})").collect()[0]

    data = call("rewrite_data_files", f"`table` => {ident}, `options` => map({opts_sql})")
    deletes = call("rewrite_position_delete_files", f"`table` => {ident}, `options` => map('rewrite-all', 'true')")
    expired = call(
        "expire_snapshots", f"`table` => {ident}, `older_than` => now(), `retain_last` => {int(keep_snapshots):d}"
    )
    return MaintenanceResult(
        before,
        int(data["rewritten_data_files_count"]),
        int(deletes["rewritten_delete_files_count"]),
        int(expired["deleted_data_files_count"]) + int(expired["deleted_position_delete_files_count"]),
    )
