"""The Iceberg catalog: pyiceberg's SQL catalog in the metastore's own PostgreSQL.

Tables are ``ingest.<source>`` (the segments' data files) and ``ingest_rejects.<source>``
(their rejects files). Metadata lives under ``<segment_store>/<source>/_iceberg/<kind>``; the
data files stay where Spark wrote them (``<segment_store>/<source>/segments/<build>/``) and are
referenced by absolute URI. The catalog's tables are created by migration 0009, never by
pyiceberg.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import create_engine

from ingest_common.store_uri import canonical_store_uri
from metastore.connection import LOCK_TIMEOUT_MS, ConnectionLimits, bounded_connect
from metastore.tables import TableKind

CATALOG_NAME = "ingest"
NAMESPACES = {TableKind.DATA: "ingest", TableKind.REJECTS: "ingest_rejects"}


class MetastoreCatalog(SqlCatalog):
    """pyiceberg's SqlCatalog on connections made by psycopg from the metastore's own URL or
    DSN (whatever form ``INGEST_DATABASE_URL`` takes), with the metastore's bounded waits."""

    def __init__(self, database_url: str, **properties: str) -> None:
        # SqlCatalog.__init__ would build its engine from a SQLAlchemy URL; the rest is its own.
        Catalog.__init__(
            self,
            CATALOG_NAME,
            uri="postgresql+psycopg://",
            init_catalog_tables="false",
            **{**s3_properties(os.environ), **properties},
        )

        limits = ConnectionLimits.from_env()

        def connect() -> Any:
            # Set at connect (options), not with SET: the pool's rollbacks would undo a SET.
            return bounded_connect(
                database_url,
                limits,
                application_name="ingest-table",
                options=f"-c statement_timeout={limits.statement_timeout_ms} -c lock_timeout={LOCK_TIMEOUT_MS}",
            )

        self.engine = create_engine("postgresql+psycopg://", creator=connect, pool_pre_ping=True)
        self._init_catalog()

    def close(self) -> None:
        self.engine.dispose()


def s3_properties(env: Mapping[str, str]) -> dict[str, str]:
    """An ``s3a://`` store is reached with the usual AWS variables (as the workers reach it):
    pyiceberg's file IO takes the endpoint and region as catalog properties, not from them."""
    props = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        props["s3.endpoint"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        props["s3.region"] = region
    for variable, prop in (
        ("AWS_ACCESS_KEY_ID", "s3.access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"),
        ("AWS_SESSION_TOKEN", "s3.session-token"),
    ):
        if env.get(variable):
            props[prop] = env[variable]
    return props


def identifier(source: str, kind: TableKind) -> tuple[str, str]:
    return (NAMESPACES[kind], source)


def table_location(segment_store: str, source: str, kind: TableKind) -> str:
    """Where a new table's metadata goes: beside the source's segments, never under a build
    directory, so ``ingest gc`` (which deletes only under registered builds) never touches it."""
    return f"{canonical_store_uri(segment_store).rstrip('/')}/{source}/_iceberg/{kind.value}"
