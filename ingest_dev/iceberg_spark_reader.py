"""Read the Iceberg tables with Spark, as a Spark user would: Iceberg's ``SparkCatalog`` over its
``JdbcCatalog`` on the metastore's PostgreSQL (the rows pyiceberg's SQL catalog writes).

Runs as a plain script under the Python of the reader's own virtualenv (the pyspark that
Iceberg's newest Spark runtime is built for, see ingest_dev/iceberg_spark.py), so it imports
nothing from ``ingest`` or ``ingest_dev``:

    <reader-python> ingest_dev/iceberg_spark_reader.py --jdbc-url jdbc:postgresql://H:P/DB
        --user U --jars A.jar,B.jar [--coordinates] TABLE...

The password, if any, comes in ``INGEST_ICEBERG_JDBC_PASSWORD`` (not on the command line).
TABLE is ``ingest.<namespace>.<name>``. Prints one JSON object on its last stdout line, per
table: its columns, the ones Spark refuses to read (``_partition``: see RESERVED), the row
count, the count of distinct rows by ``key`` (_topic, _partition, _offset; without the refused
ones) and by ``_file`` plus key, the number of data files, rows per (_topic, _partition) when
Spark can read ``_partition``, and with ``--coordinates`` every row's [_file, *key], sorted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

CATALOG = "ingest"  # pyiceberg's catalog_name (ingest/table/catalog.py, CATALOG_NAME)


def catalog_conf(jdbc_url: str, user: str, password: str | None) -> dict[str, str]:
    """The Spark settings that make ``ingest`` the metastore's Iceberg catalog (read only:
    the catalog tables exist, created by migration 0009, and are never altered)."""
    prefix = f"spark.sql.catalog.{CATALOG}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        f"{prefix}.uri": jdbc_url,
        f"{prefix}.jdbc.user": user,
        # pyiceberg's schema has the iceberg_type column (Iceberg's V1); with V0 Iceberg would
        # not filter on it, with V1 and no column it would ALTER the table.
        f"{prefix}.jdbc.schema-version": "V1",
        # The catalog's tables are the migration's: no CREATE TABLE IF NOT EXISTS from Java.
        f"{prefix}.jdbc.init-catalog-tables": "false",
        # Required by JdbcCatalog; used only to place tables it would create, which a reader never does.
        f"{prefix}.warehouse": "file:///nonexistent-ingest-warehouse",
    }
    if password:
        conf[f"{prefix}.jdbc.password"] = password
    return conf


# Iceberg's metadata column names (org.apache.iceberg.MetadataColumns): Iceberg's Spark scan
# refuses to read a table column so named ("Table column names conflict with names reserved for
# Iceberg metadata columns", apache/iceberg#3456), and the tables have `_partition`.
RESERVED = (
    "_file",
    "_pos",
    "_deleted",
    "_spec_id",
    "_partition",
    "_row_id",
    "_last_updated_sequence_number",
    "_change_type",
    "_change_ordinal",
    "_commit_snapshot_id",
)
REFUSAL = "conflict with names reserved for Iceberg metadata columns"


def read_table(spark: Any, table: str, coordinates: bool) -> dict[str, Any]:
    """What Spark sees of one table: every row is counted, and identified by the data file it
    comes from (``_file``, Iceberg's metadata column) and its Kafka topic and offset; the
    Kafka partition too when Spark can read that column."""
    columns = list(spark.table(table).columns)
    refused: dict[str, str] = {}
    for column in (c for c in columns if c in RESERVED):
        try:
            # Not an aggregate: Iceberg answers count(column) from the manifests' metrics, no scan.
            spark.sql(f"SELECT `{column}` FROM {table} LIMIT 1").collect()
        except Exception as exc:  # py4j's error carrying Iceberg's ValidationException
            if REFUSAL not in str(exc):
                raise
            refused[column] = next(line for line in str(exc).splitlines() if REFUSAL in line).strip(": ")[:500]
    key = ["_topic", "_partition", "_offset"] if "_partition" not in refused else ["_topic", "_offset"]
    keys = ", ".join(key)
    row = spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT {keys}) AS k, count(DISTINCT _file, {keys}) AS f FROM {table}"
    ).collect()[0]
    doc: dict[str, Any] = {
        "columns": columns,
        "refused_columns": refused,
        "rows": int(row["n"]),
        "key": key,
        "distinct_keys": int(row["k"]),
        "distinct_file_keys": int(row["f"]),
        "files": int(spark.sql(f"SELECT count(*) AS n FROM {table}.files").collect()[0]["n"]),
        "partitions": None,
    }
    if "_partition" not in refused:
        doc["partitions"] = {
            f"{r['_topic']}/{r['_partition']}": int(r["n"])
            for r in spark.sql(
                f"SELECT _topic, _partition, count(*) AS n FROM {table} GROUP BY 1, 2 ORDER BY 1, 2"
            ).collect()
        }
    if coordinates:
        doc["coordinates"] = [
            [r["_file"], *(r[k] for k in key)]
            for r in spark.sql(f"SELECT _file, {keys} FROM {table} ORDER BY _file, {keys}").collect()
        ]
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iceberg_spark_reader")
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--jars", required=True, help="comma-separated: Iceberg's Spark runtime, PostgreSQL's driver")
    parser.add_argument("--coordinates", action="store_true", help="also list every row's [_file, *key]")
    parser.add_argument("--master", default="local[1]")
    parser.add_argument("tables", nargs="+", help="ingest.<namespace>.<name>")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession  # type: ignore[import-not-found,unused-ignore]

    launched = time.time()
    builder = (
        SparkSession.builder.master(args.master)
        .appName("ingest-iceberg-reader")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "1")
    )
    for key, value in catalog_conf(args.jdbc_url, args.user, os.environ.get("INGEST_ICEBERG_JDBC_PASSWORD")).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    result: dict[str, Any] = {"spark_version": spark.version, "tables": {}}
    for table in args.tables:
        result["tables"][table] = read_table(spark, table, args.coordinates)
    result["seconds"] = round(time.time() - launched, 3)
    spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
