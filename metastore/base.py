"""The connection every part of the metastore shares, and its query helpers.

One store owns one connection and is used by one thread at a time; the worker gives its
polling thread and its publisher thread one each. A broken connection is dropped and
re-opened on the next call. psycopg's errors are translated at one boundary:
``metastore.connection.wrap_exceptions``, around every statement.
"""

from __future__ import annotations

from typing import Any, Self

import psycopg

from ingest_common.model import TopicPartition
from metastore.connection import BoundedConnection, ConnectionLimits, connect, wrap_exceptions
from metastore.errors import CommitOutcomeUnknown, PublishConflict
from metastore.queries import query

Row = dict[str, Any]


class StoreBase:
    """The connection and the named-query helpers the concern mixins build on."""

    def __init__(self, url: str, limits: ConnectionLimits | None = None) -> None:
        """``limits``: the connection's bounds; from the environment (``INGEST_DB_*``) when not given."""
        self.url = url
        self._limits = limits
        self._conn: BoundedConnection[Row] | None = None

    def _connection(self) -> BoundedConnection[Row]:
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = None
        if self._conn is None:
            self._conn = connect(self.url, self._limits)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(self, query_name: str, **params: Any) -> list[Row]:
        with wrap_exceptions(self.url):
            return self._connection().execute(query(query_name), params).fetchall()

    def _fetch_none(self, query_name: str, **params: Any) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute(query(query_name), params)

    def _commit_one(self, query_name: str, params: dict[str, Any], what: str) -> Row:
        """Run one statement that commits on its own (autocommit) and return its one row. An
        error the server replied with ended the statement, and with it the transaction,
        without a commit; no reply (the connection lost) and it may have committed:
        :class:`CommitOutcomeUnknown`, with the server session to end before looking it up."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            try:
                row = conn.execute(query(query_name), params).fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if conn.closed or conn.broken:
                    self._conn = None
                    raise CommitOutcomeUnknown(f"connection lost while {what}: {exc}", conn.session) from exc
                raise
        assert row is not None
        return row

    def ping(self) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute("SELECT 1")


def conflict_from_row(row: Row) -> PublishConflict:
    """A failed check as returned by ``ingest_lock_ranges`` / ``ingest_publish_segment``."""
    return PublishConflict(
        row["reason"], TopicPartition(row["topic"], row["partition"]), row["expected"], row["actual"]
    )
