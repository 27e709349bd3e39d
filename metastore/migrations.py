"""Schema migrations: plain SQL files in ``migrations/`` applied with yoyo."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations
from yoyo.exceptions import LockTimeout

from metastore.connection import ConnectionLimits, wrap_exceptions
from metastore.errors import MetastoreError, MigrationLocked, SchemaMissing

# The package's schema/ resource: a link to the top-level migrations/ folder in a checkout, a
# folder of copies in an installed wheel (package data), loaded like the named queries.
MIGRATIONS = resources.files("metastore") / "schema"


def _read_migrations() -> Any:
    # yoyo reads a directory: as_file gives one for any resource (a temporary copy when the
    # package is not on a file system, e.g. a zip), alive while the migrations are read.
    with resources.as_file(MIGRATIONS) as directory:
        migrations = read_migrations(str(directory))
        if not migrations:
            # An incomplete installation must not report "up to date" on an empty database.
            raise MetastoreError(f"no migrations found in {directory}: the installation is incomplete")
        # yoyo reads each file's SQL while it builds the list, so it outlives the directory.
        for migration in migrations:
            migration.load()
    return migrations


def yoyo_url(database_url: str) -> str:
    """The connection string (a URL or a libpq ``key=value`` DSN) as a yoyo URL whose every
    parameter is a query argument: yoyo hands them to psycopg as they are, so both forms,
    percent-encoded passwords and multiple hosts reach libpq unchanged."""
    params = conninfo_to_dict(database_url)
    # The TCP bounds of every metastore connection; no statement timeout: a migration may
    # rightly take long (a new index on a large table).
    params.update(ConnectionLimits.from_env().tcp_params(database_url))
    return "postgresql+psycopg:///?" + urlencode({k: str(v) for k, v in params.items()})


@contextmanager
def _backend(database_url: str) -> Iterator[Any]:
    """yoyo's backend on its own connection, closed afterwards; psycopg errors translated.
    yoyo never parses the user's string (yoyo_url): its messages would quote it, password
    included, and libpq's parse errors are psycopg's."""
    with wrap_exceptions(database_url):
        backend = get_backend(yoyo_url(database_url))
        try:
            yield backend
        finally:
            backend.connection.close()


def apply_migrations(database_url: str, *, break_lock: bool = False, lock_timeout_s: float = 10.0) -> list[str]:
    """Apply every pending migration; returns the ids applied (empty: already up to date).

    Concurrent runs are serialized by yoyo's lock row. A run killed while holding it leaves the
    row behind: ``break_lock`` removes it first (only when no other run is in progress)."""
    with _backend(database_url) as backend:
        migrations = _read_migrations()
        if break_lock:
            backend.break_lock()
        try:
            with backend.lock(timeout=lock_timeout_s):
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
        except LockTimeout as exc:
            holder = str(exc).split(" (run yoyo", 1)[0]
            raise MigrationLocked(
                f"the migration lock is held ({holder}) after {lock_timeout_s:g} s: another "
                "`ingest migrate` is running, or one died holding it; if none is running, run "
                "`ingest migrate --break-lock`"
            ) from None
        return [m.id for m in pending]


def pending_migrations(database_url: str) -> list[str]:
    """Ids of the migrations not applied yet (empty: the schema is what this release needs)."""
    with _backend(database_url) as backend:
        return [m.id for m in backend.to_apply(_read_migrations())]


def require_current_schema(database_url: str) -> None:
    """Raise SchemaMissing, naming what is missing, unless every migration is applied: a
    worker of a newer release must not start on an older schema and fail at its first publish."""
    pending = pending_migrations(database_url)
    if pending:
        raise SchemaMissing(
            f"the metastore schema is out of date ({', '.join(pending)} not applied): run `ingest migrate` first"
        )
