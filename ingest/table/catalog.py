"""The Iceberg catalog of a source's tables (:func:`open_catalog`): pyiceberg's SQL catalog in the
metastore's own PostgreSQL (:class:`MetastoreCatalog`, the default), or the catalog a spec's
``[table] catalog`` names (REST, Glue, Hive, SQL...; ``ingest.spec.table``).

Tables are ``ingest.<source>`` (the segments' data files) and ``ingest_rejects.<source>``
(their rejects files). In the metastore's catalog their metadata lives under
``<segment_store>/<source>/_iceberg/<kind>``; another catalog places it in its own warehouse.
Either way the data files stay where Spark wrote them
(``<segment_store>/<source>/segments/<build>/``) and are referenced by absolute URI. The
metastore catalog's tables are created by migration 0009, never by pyiceberg.

A commit made under :meth:`MetastoreCatalog.fenced` runs its fence on the connection that swaps
the table's metadata pointer, in the same transaction, after the swap and before its COMMIT
(the table committer records the commit there: ``metastore.tables.fence_commit``). A fence
that refuses rolls the swap back, and the commit fails as a conflict
(``CommitFailedException``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import AVAILABLE_CATALOGS, Catalog, CatalogType
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NotInstalledError
from requests import PreparedRequest, Response, Session
from requests.adapters import HTTPAdapter
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection

from ingest.spec.model import SourceSpec
from ingest.spec.table import TableSettings, catalog_env, is_secret_property
from ingest.table.errors import CatalogUnavailable
from ingest_common.errors import ConfigError, first_line
from ingest_common.redact import register_secrets
from ingest_common.store_uri import canonical_store_uri
from metastore.connection import LOCK_TIMEOUT_MS, ConnectionLimits, bounded_connect
from metastore.tables import StaleTableCommit, TableKind, TableStore

CATALOG_NAME = "ingest"
NAMESPACES = {TableKind.DATA: "ingest", TableKind.REJECTS: "ingest_rejects"}
# Every request to a REST catalog: (connect, read) seconds. pyiceberg sets no timeout, and a
# catalog that never answers would hang the committer where no retry or health check sees it.
REST_TIMEOUT_S = (10.0, 60.0)


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


class _RestAdapter(HTTPAdapter):
    """Every request it sends without a timeout of its own gets :data:`REST_TIMEOUT_S`, and
    every ``add-schema`` update of a commit its ``last-column-id`` (:func:`_with_last_column_id`)."""

    def send(self, request: PreparedRequest, **kwargs: Any) -> Response:  # type: ignore[override]
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = REST_TIMEOUT_S
        if request.method == "POST" and isinstance(request.body, str | bytes):
            body = _with_last_column_id(request.body)
            if body is not None:
                request.body = body
                request.headers["Content-Length"] = str(len(body))
        return super().send(request, **kwargs)


def _with_last_column_id(body: str | bytes) -> bytes | None:
    """A commit's body with ``last-column-id`` in each ``add-schema`` update that lacks it (the
    schema's highest field id; the committer only adds columns, so it is the table's last column
    id), or None when nothing changes. The REST spec keeps the field (deprecated, optional);
    pyiceberg 0.10+ no longer sends it, and servers built before Iceberg 1.8 (Nessie 0.99)
    refuse an ``add-schema`` without it: every create and schema change would fail there."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    changes = [doc, *doc.get("table-changes", [])]  # a commit, or a multi-table transaction
    patched = False
    for change in changes:
        for update in change.get("updates", []) if isinstance(change, dict) else ():
            if isinstance(update, dict) and update.get("action") == "add-schema" and "last-column-id" not in update:
                update["last-column-id"] = max(_field_ids(update.get("schema")), default=0)
                patched = True
    return json.dumps(doc).encode() if patched else None


def _field_ids(node: Any) -> Iterator[int]:
    """Every field id in a schema's JSON (struct fields, list elements, map keys and values)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("id", "element-id", "key-id", "value-id") and isinstance(value, int):
                yield value
            else:
                yield from _field_ids(value)
    elif isinstance(node, list):
        for item in node:
            yield from _field_ids(item)


class BoundedRestCatalog(RestCatalog):
    """pyiceberg's REST catalog whose every request is bounded (:data:`REST_TIMEOUT_S`; a
    timeout is an ``OSError``, as requests' errors are, which the committer's loop retries) and
    whose schema updates carry ``last-column-id`` (:func:`_with_last_column_id`)."""

    def _create_session(self) -> Session:
        session = super()._create_session()
        adapter = _RestAdapter()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


def open_catalog(database_url: str, table: TableSettings, env: Mapping[str, str] | None = None) -> Catalog:
    """The catalog of a source's tables: the metastore's own (no ``[table] catalog``), or the one
    the spec names, with the properties the environment gives (secrets: ``ingest.spec.table``)
    and the AWS variables as its S3 file IO's defaults; asked for its namespaces once, so a
    catalog that does not answer (or refuses the credentials) fails here, in one line
    (:class:`CatalogUnavailable`), never at the first commit."""
    if not table.external:
        return MetastoreCatalog(database_url)
    env = os.environ if env is None else env
    given = catalog_env(env)
    props = {**s3_properties(env), **dict(table.catalog), **given}
    register_secrets(v for k, v in props.items() if is_secret_property(k) or (k in given and k == "uri"))
    kind = CatalogType(props["type"])
    load = (
        (lambda name, conf: BoundedRestCatalog(name, **conf)) if kind is CatalogType.REST else AVAILABLE_CATALOGS[kind]
    )
    try:
        catalog = load(CATALOG_NAME, props)
        catalog.list_namespaces()
    except (NotInstalledError, ValueError, KeyError, TypeError) as exc:
        # pyiceberg's word on the properties (a missing uri, an extra it does not have).
        raise ConfigError(f"table.catalog: pyiceberg refuses {table.describe()}: {first_line(exc)}") from exc
    except Exception as exc:  # whatever the catalog's client raises when it cannot reach it, or is refused
        raise CatalogUnavailable(f"{table.describe()} is unavailable: {first_line(exc)}") from exc
    return catalog


def source_catalog(database_url: str, source: str) -> Catalog:
    """The catalog of the source's tables, as its latest spec names it (:func:`open_catalog`)."""
    with TableStore(database_url) as store:
        table = SourceSpec.from_json(store.latest_spec(source)).table
    return open_catalog(database_url, table)


def close_catalog(catalog: Catalog) -> None:
    """Release what the catalog holds (the metastore catalog's connections; a REST catalog's
    session)."""
    if isinstance(catalog, MetastoreCatalog):
        catalog.close()
    elif isinstance(catalog, RestCatalog):
        catalog._session.close()


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
