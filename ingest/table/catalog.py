"""The Iceberg catalog: pyiceberg's SQL catalog in the metastore's own PostgreSQL.

Tables are ``ingest.<source>`` (the segments' data files) and ``ingest_rejects.<source>``
(their rejects files). Metadata lives under ``<segment_store>/<source>/_iceberg/<kind>``; the
data files stay where Spark wrote them (``<segment_store>/<source>/segments/<build>/``) and are
referenced by absolute URI. The catalog's tables are created by migration 0009, never by
pyiceberg.

A commit made under :meth:`MetastoreCatalog.fenced` runs its fence on the connection that swaps
the table's metadata pointer, in the same transaction, after the swap and before its COMMIT
(the table committer records the commit there: ``metastore.tables.fence_commit``). A fence
that refuses rolls the swap back, and the commit fails as a conflict
(``CommitFailedException``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection

from ingest_common.store_uri import canonical_store_uri
from metastore.connection import LOCK_TIMEOUT_MS, ConnectionLimits, bounded_connect
from metastore.tables import StaleTableCommit, TableKind

CATALOG_NAME = "ingest"
NAMESPACES = {TableKind.DATA: "ingest", TableKind.REJECTS: "ingest_rejects"}


# What a fence is given: the psycopg connection of the catalog's swap, inside its transaction.
Fence = Callable[[Any], None]


@dataclass(slots=True)
class FenceRun:
    """Whether a fenced commit's fence ran (a commit that swapped nothing runs none)."""

    fence: Fence
    ran: bool = False


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
            # Set at connect (options), not with SET: the pool's rollbacks would undo a SET. A
            # session idle inside a transaction (a frozen process in a swap) is ended by the
            # server, its locks released and its swap rolled back.
            return bounded_connect(
                database_url,
                limits,
                application_name="ingest-table",
                options=(
                    f"-c statement_timeout={limits.statement_timeout_ms} -c lock_timeout={LOCK_TIMEOUT_MS} "
                    f"-c idle_in_transaction_session_timeout={limits.statement_timeout_ms}"
                ),
            )

        self.engine = create_engine("postgresql+psycopg://", creator=connect, pool_pre_ping=True)
        self._fence: FenceRun | None = None
        event.listen(self.engine, "commit", self._before_commit)
        self._init_catalog()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def fenced(self, fence: Fence) -> Iterator[FenceRun]:
        """The next commit of this catalog (one thread uses it) runs ``fence`` on its connection
        before its COMMIT: pyiceberg's ``commit_table`` commits once, after the compare-and-swap
        of the metadata pointer, and a commit that changes nothing swaps nothing, runs no fence."""
        self._fence = FenceRun(fence)
        try:
            yield self._fence
        finally:
            self._fence = None

    def _before_commit(self, conn: Connection) -> None:
        run, self._fence = self._fence, None
        if run is None:
            return
        driver = conn.connection.driver_connection
        assert driver is not None  # checked out, inside its transaction
        try:
            run.fence(driver)
        except BaseException as exc:
            # SQLAlchemy counts a transaction whose commit raised as ended and returns its
            # connection to the pool as it is, still inside it: the swap is rolled back here, or
            # the connection closed (the server rolls back), so no later use of it commits it.
            try:
                driver.rollback()
            except Exception:
                driver.close()
            if isinstance(exc, StaleTableCommit):
                raise CommitFailedException(str(exc)) from exc
            raise
        run.ran = True


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
