"""Spark as a reader of the Iceberg tables (tests and checks; nothing in the product uses it), as
a Spark user would read them: Iceberg's ``SparkCatalog`` over its ``JdbcCatalog`` on the
metastore's PostgreSQL (the rows pyiceberg's SQL catalog writes), catalog ``ingest``:
``ingest.ingest.<source>`` and ``ingest.ingest_rejects.<source>``.

It runs on the product's own pyspark with Iceberg's runtime and PostgreSQL's JDBC driver from the
project's pinned jar set (``scripts/spark-jars/pom.xml``): in a session of its own, or in a new
session on an existing SparkContext that has the jars (``create_session(..., connectors=True)``
or an s3a:// store), such as the tests' ``spark`` fixture.

    python -m ingest_dev.iceberg_spark read [--database-url URL | --catalog JSON] [--coordinates]
        SOURCE [--rejects | --both]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ingest.table.catalog import CATALOG_NAME
from ingest.table.spark_catalog import catalog_conf, quoted, spark_table_name
from metastore.tables import TableKind

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
# A session of the reader's own: small, one task at a time.
READER_CONF = {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "1"}


def external_catalog_conf(properties: dict[str, str]) -> dict[str, str]:
    """The Spark settings that make ``ingest`` the catalog a spec's ``[table] catalog`` names:
    Iceberg Java takes a REST catalog's properties under the same names pyiceberg does
    (``type``, ``uri``, ``prefix``, ``warehouse``, ``token``, ``s3.*`` of its S3FileIO)."""
    prefix = f"spark.sql.catalog.{CATALOG_NAME}"
    return {prefix: "org.apache.iceberg.spark.SparkCatalog", **{f"{prefix}.{k}": v for k, v in properties.items()}}


def external_reader_session() -> Any:
    """A local Spark of its own for a REST catalog's tables: Iceberg's Spark runtime and its AWS
    bundle only. Such a catalog hands its clients Iceberg's S3FileIO, which needs AWS SDK modules
    newer than those the project's S3A connector pins (``scripts/spark-jars/pom.xml``), so it
    cannot run beside them; the bundle is fetched with the tests' REST catalog
    (``scripts/nessie/pom.xml``). One SparkContext per process: run it in a process of its own
    (``python -m ingest_dev.iceberg_spark read --catalog ...``) where another Spark runs."""
    from pyspark.sql import SparkSession

    from ingest.spark.jars import spark_jars
    from ingest_dev.maven import iceberg_aws_bundle

    runtime = [str(j) for j in spark_jars() if j.name.startswith("iceberg-spark-runtime-")]
    builder = SparkSession.builder.master("local[1]").appName("ingest-iceberg-rest-reader")
    for key, value in {**READER_CONF, "spark.jars": ",".join([*runtime, str(iceberg_aws_bundle())])}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def spark_table(source: str, kind: TableKind = TableKind.DATA) -> str:
    """The table's name in Spark: catalog ``ingest``, the pyiceberg namespace, the source, each
    quoted (a source named ``dbz-mysql`` or ``order``)."""
    return spark_table_name(source, kind)


def read_table(spark: Any, table: str, coordinates: bool) -> dict[str, Any]:
    """What Spark sees of one table: every row is counted, and identified by the data file it
    comes from (``_file``, Iceberg's metadata column) and its Kafka topic and offset; the
    Kafka partition too when Spark can read that column. Returns its columns, the ones Spark
    refuses to read (``refused_columns``: see RESERVED), the row count, the count of distinct
    rows by ``key`` (_topic, _partition, _offset; without the refused ones) and by ``_file``
    plus key, the number of data files, rows per (_topic, _partition) when Spark can read
    ``_partition``, and with ``coordinates`` every row's [_file, *key], sorted."""
    columns = list(spark.table(table).columns)
    refused: dict[str, str] = {}
    for column in (c for c in columns if c in RESERVED):
        try:
            # Not an aggregate: Iceberg answers count(column) from the manifests' metrics, no scan.
            spark.sql(f"SELECT {quoted(column)} FROM {table} LIMIT 1").collect()
        except Exception as exc:  # Spark's AnalysisException or py4j's error carrying Iceberg's ValidationException
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


def read_tables(
    database_url: str,
    tables: list[str],
    coordinates: bool = False,
    spark: Any | None = None,
    catalog: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Read the tables (``ingest.<namespace>.<name>``) with Spark: ``{"spark_version",
    "seconds", "tables": {table: read_table(...)}}``. ``spark``: a classic session whose
    SparkContext has the project's jars; the reader works in a new session on it (its own SQL
    settings and catalogs, so each read sees the catalog of its own ``database_url``). Without
    one, a local session is started and stopped here. ``catalog``: the properties of the
    catalog a spec's ``[table]`` names, read instead of the metastore's
    (:func:`external_catalog_conf`)."""
    from ingest.spark.start import create_session

    started = time.monotonic()
    own = spark is None
    if spark is not None:
        base: Any = spark
    elif catalog:
        base = external_reader_session()
    else:
        base = create_session("local[1]", "ingest-iceberg-reader", READER_CONF, connectors=True)
    try:
        session = base.newSession()
        conf = external_catalog_conf(catalog) if catalog else catalog_conf(database_url)
        for key, value in conf.items():
            session.conf.set(key, value)
        result: dict[str, Any] = {
            "spark_version": session.version,
            "tables": {table: read_table(session, table, coordinates) for table in tables},
        }
    finally:
        if own:
            base.stop()
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest_dev.iceberg_spark")
    commands = parser.add_subparsers(dest="command", required=True)
    read = commands.add_parser("read", help="read a source's table with Spark; prints JSON")
    read.add_argument("--database-url", default=os.environ.get("INGEST_DATABASE_URL"))
    read.add_argument("--rejects", action="store_true", help="the rejects table")
    read.add_argument("--coordinates", action="store_true")
    read.add_argument(
        "--catalog",
        help="the spec's [table] catalog as JSON (and Spark's own settings), read instead of the metastore's",
    )
    read.add_argument("--both", action="store_true", help="the data table and the rejects table")
    read.add_argument("source")
    args = parser.parse_args(argv)
    catalog = json.loads(args.catalog) if args.catalog else None
    if not args.database_url and not catalog:
        parser.error("--database-url or INGEST_DATABASE_URL is required")
    kinds = list(TableKind) if args.both else [TableKind.REJECTS if args.rejects else TableKind.DATA]
    tables = [spark_table(args.source, kind) for kind in kinds]
    print(json.dumps(read_tables(args.database_url, tables, coordinates=args.coordinates, catalog=catalog), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
