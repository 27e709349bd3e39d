"""Iceberg's Spark catalog over the metastore's own catalog tables: Iceberg's ``SparkCatalog``
over its ``JdbcCatalog`` on the metastore's PostgreSQL (the rows pyiceberg's SQL catalog writes,
migrations/0009), named ``ingest``. The upsert committer merges through it
(ingest.table.upsert); tests and checks read the tables through it.

Every name in the SQL text built here and in ingest.table.merge is quoted (:func:`quoted`): a
source is ``[a-z][a-z0-9_-]{0,62}`` (``dbz-mysql``, ``order``) and a column may be any
``[A-Za-z][A-Za-z0-9_]*`` (``select``), which Spark's parser reads as an expression or a keyword
unquoted."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

from ingest.table.catalog import CATALOG_NAME, identifier
from metastore.tables import TableKind

# Iceberg's SQL extensions (MERGE INTO, branches, procedures): a static setting of the session.
EXTENSIONS_CONF = {"spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"}


def quoted(name: str) -> str:
    """``name`` as one identifier of Spark SQL: in backticks, a backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """``value`` as a string literal of Spark SQL (its backslash escapes on, Spark's default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_table_name(source: str, kind: TableKind = TableKind.DATA) -> str:
    """A source's table in Spark SQL, every part quoted (catalog ``ingest``, the pyiceberg
    namespace, the source), as ``"`ingest`.`ingest`.`dbz-mysql`"``."""
    return ".".join(quoted(part) for part in (CATALOG_NAME, *identifier(source, kind)))


def jdbc_settings(database_url: str) -> tuple[str, str, str | None]:
    """The metastore's URL or DSN (any form psycopg takes) as PgJDBC's URL, user and password."""
    params = conninfo_to_dict(database_url)
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    if "," in host or host.startswith("/"):
        raise ValueError(f"the Spark reader needs one TCP host in the database URL, not {host!r}")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or os.environ.get("USER") or "postgres")
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    password = params.get("password") or os.environ.get("PGPASSWORD")
    url = f"jdbc:postgresql://{f'[{host}]' if ':' in host else host}:{port}/{dbname}"
    if params.get("sslmode"):
        url += f"?sslmode={params['sslmode']}"
    return url, user, None if password is None else str(password)


def catalog_conf(database_url: str) -> dict[str, str]:
    """The Spark settings that make ``ingest`` the metastore's Iceberg catalog (the catalog's
    tables exist, created by migration 0009, and are never altered; tables are created by
    pyiceberg, so ``warehouse`` places none)."""
    jdbc_url, user, password = jdbc_settings(database_url)
    prefix = f"spark.sql.catalog.{CATALOG_NAME}"
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
        # Hadoop's default local file system for this catalog's files: the product's sessions use
        # the raw one (no .crc files, ingest/spark/session.py), whose getScheme() Hadoop 3.4 does
        # not implement, and Iceberg's scan planning asks every table's file system for it.
        f"{prefix}.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
    }
    if password:
        conf[f"{prefix}.jdbc.password"] = password
    return conf
