"""Connections to PostgreSQL and the one place psycopg errors are translated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from ingest_common.redact import redact
from metastore.errors import MetastoreError, MetastoreUnavailable, SchemaMissing

# Bounded waits so that no caller (least of all a rebalance callback) hangs on the metastore.
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 30_000
LOCK_TIMEOUT_MS = 10_000


def redact_url(url: str) -> str:
    """Hide the password of a connection URL or DSN (for logs, status and errors)."""
    return redact(url)


@contextmanager
def wrap_exceptions(url: str = "") -> Iterator[None]:
    """Translate psycopg errors into the metastore's own exceptions."""
    try:
        yield
    except MetastoreError:
        raise
    except (pg_errors.UndefinedTable, pg_errors.UndefinedFunction) as exc:
        raise SchemaMissing("the metastore schema is missing or out of date: run `ingest migrate` first") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        where = f" at {redact_url(url)}" if url else ""
        detail = redact_url(str(exc).strip().splitlines()[0]) if str(exc).strip() else type(exc).__name__
        raise MetastoreUnavailable(f"PostgreSQL unavailable{where}: {detail}") from exc
    except psycopg.Error as exc:
        raise MetastoreError(f"metastore error: {redact_url(str(exc).strip())}") from exc


def connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    """An autocommit connection (transactions are always explicit) with bounded waits."""
    with wrap_exceptions(url):
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            row_factory=dict_row,
            application_name="ingest",
        )
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        return conn
