"""Connections to PostgreSQL and the one place psycopg errors are translated.

Every wait on the server is bounded, so that no caller (a rebalance callback, the publishing
thread) hangs on a metastore that stopped answering (``ConnectionLimits``, ``INGEST_DB_*``):

- connecting: ``connect_timeout``, the whole handshake;
- a statement: the server cancels it after ``statement_timeout`` and a lock wait after
  ``lock_timeout``. That is a reply: the statement's transaction did not commit;
- a reply that never comes (a black-holed path, a frozen server or proxy: the server's cancel
  cannot reach us either): ``BoundedConnection`` gives up ``REPLY_GRACE_S`` after the
  statement timeout and drops the connection. The outcome of a statement in flight is then
  unknown, as after any broken connection (``segments.py`` makes a publish's
  ``CommitOutcomeUnknown``);
- a dead peer on a real network: TCP keepalives (an idle connection, e.g. the LISTEN one) and
  ``tcp_user_timeout`` (data never acknowledged) make the kernel, and libpq, fail the
  connection. They cannot see a peer whose kernel still acknowledges (a frozen process);
  the reply deadline can.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from ingest_common.errors import ConfigError
from ingest_common.redact import redact
from metastore.errors import MetastoreError, MetastoreUnavailable, SchemaMissing, Session
from metastore.queries import query

LOCK_TIMEOUT_MS = 10_000
# How long after the statement timeout a reply may still come: the server's cancel reply and
# the round trip. A reply later than that will not come.
REPLY_GRACE_S = 5.0
# psycopg's own interval between checks for a signal (Ctrl-C) while it waits.
_WAIT_INTERVAL_S = 0.1

Row = TypeVar("Row", covariant=True)
_Result = TypeVar("_Result")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds of every metastore connection. ``from_env`` reads ``INGEST_DB_<FIELD>``
    (e.g. ``INGEST_DB_STATEMENT_TIMEOUT_S``); a libpq parameter of the same name given in the
    database URL itself (``?keepalives_idle=60``) takes precedence over the variable."""

    connect_timeout_s: int = 5
    statement_timeout_s: float = 30.0
    keepalives_idle_s: int = 30
    keepalives_interval_s: int = 10
    keepalives_count: int = 3
    tcp_user_timeout_s: float = 30.0
    reply_grace_s: float = REPLY_GRACE_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionLimits:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            connect_timeout_s=int(_positive(env, "INGEST_DB_CONNECT_TIMEOUT_S", defaults.connect_timeout_s, True)),
            statement_timeout_s=_positive(env, "INGEST_DB_STATEMENT_TIMEOUT_S", defaults.statement_timeout_s),
            keepalives_idle_s=int(_positive(env, "INGEST_DB_KEEPALIVES_IDLE_S", defaults.keepalives_idle_s, True)),
            keepalives_interval_s=int(
                _positive(env, "INGEST_DB_KEEPALIVES_INTERVAL_S", defaults.keepalives_interval_s, True)
            ),
            keepalives_count=int(_positive(env, "INGEST_DB_KEEPALIVES_COUNT", defaults.keepalives_count, True)),
            tcp_user_timeout_s=_positive(env, "INGEST_DB_TCP_USER_TIMEOUT_S", defaults.tcp_user_timeout_s),
        )

    @property
    def statement_timeout_ms(self) -> int:
        return max(1, round(self.statement_timeout_s * 1000))

    @property
    def reply_timeout_s(self) -> float:
        """How long the client waits for any reply before it drops the connection."""
        return self.statement_timeout_s + self.reply_grace_s

    def tcp_params(self, url: str = "") -> dict[str, Any]:
        """libpq's connection parameters for the handshake and TCP bounds, but those ``url`` sets."""
        params = {
            "connect_timeout": self.connect_timeout_s,
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_s,
            "keepalives_interval": self.keepalives_interval_s,
            "keepalives_count": self.keepalives_count,
            "tcp_user_timeout": max(1, round(self.tcp_user_timeout_s * 1000)),
        }
        given = conninfo_to_dict(url) if url else {}
        return {k: v for k, v in params.items() if k not in given}


def _positive(env: Mapping[str, str], name: str, default: float, integer: bool = False) -> float:
    value = env.get(name, "")
    if value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf or (integer and not number.is_integer()):
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigError(f"{name}: expected {kind}, got {value!r}")
    return number


class BoundedConnection(psycopg.Connection[Row]):
    """A connection that waits at most ``reply_timeout_s`` for the server, on every statement,
    fetch, commit and rollback; then it drops itself and raises ``psycopg.OperationalError``
    (so ``broken`` is true, like any connection that broke mid-statement)."""

    reply_timeout_s: float = ConnectionLimits().reply_timeout_s
    # Who this connection is on the server (``connect`` sets it).
    session: Session | None = None

    def wait(self, gen: PQGen[_Result], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None) -> _Result:
        if timeout is not None:  # the caller's own bound (notifies, a cancel), handled by the caller
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.reply_timeout_s)
        except pg_errors._WaitTimeout as exc:
            # The statement may still run, and may commit: nothing more can be known or sent
            # on this connection.
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"no reply from PostgreSQL within {self.reply_timeout_s:g} s: connection dropped"
            ) from exc


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
        where = f" at {redact(url)}" if url else ""
        detail = redact(str(exc).strip().splitlines()[0]) if str(exc).strip() else type(exc).__name__
        raise MetastoreUnavailable(f"PostgreSQL unavailable{where}: {detail}") from exc
    except psycopg.Error as exc:
        raise MetastoreError(f"metastore error: {redact(str(exc).strip())}") from exc


def redact_url(url: str) -> str:
    """Hide the password of a connection URL or DSN (for logs, status and errors)."""
    return redact(url)


def bounded_connect(url: str, limits: ConnectionLimits, **kwargs: Any) -> BoundedConnection[Any]:
    """A ``BoundedConnection`` with the limits' TCP bounds (psycopg's errors untranslated)."""
    conn: BoundedConnection[Any] = BoundedConnection.connect(url, **limits.tcp_params(url), **kwargs)
    conn.reply_timeout_s = limits.reply_timeout_s
    return conn


def connect(url: str, limits: ConnectionLimits | None = None) -> BoundedConnection[dict[str, Any]]:
    """An autocommit connection (transactions are always explicit) with every wait bounded
    (``limits``: from the environment when not given)."""
    limits = ConnectionLimits.from_env() if limits is None else limits
    with wrap_exceptions(url):
        conn: BoundedConnection[dict[str, Any]] = bounded_connect(
            url, limits, autocommit=True, row_factory=dict_row, application_name="ingest"
        )
        try:
            row = conn.execute(
                query("session_setup"),
                {"statement_timeout": str(limits.statement_timeout_ms), "lock_timeout": str(LOCK_TIMEOUT_MS)},
            ).fetchone()
            assert row is not None
            conn.session = Session(row["pid"], row["started"])
        except BaseException:
            conn.close()
            raise
        return conn
