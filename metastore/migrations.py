"""Schema migrations: plain SQL files in ``migrations/`` applied with yoyo."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from yoyo import get_backend, read_migrations

from metastore.connection import wrap_exceptions
from metastore.errors import SchemaMissing

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def yoyo_url(database_url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix):]
    return database_url


@contextmanager
def _backend(database_url: str) -> Iterator[Any]:
    """yoyo's backend on its own connection, closed afterwards; psycopg errors translated."""
    with wrap_exceptions(database_url):
        backend = get_backend(yoyo_url(database_url))
        try:
            yield backend
        finally:
            backend.connection.close()


def apply_migrations(database_url: str) -> list[str]:
    """Apply every pending migration; returns the ids applied (empty: already up to date)."""
    with _backend(database_url) as backend:
        migrations = read_migrations(str(MIGRATIONS_DIR))
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
        return [m.id for m in pending]


def pending_migrations(database_url: str) -> list[str]:
    """Ids of the migrations not applied yet (empty: the schema is what this release needs)."""
    with _backend(database_url) as backend:
        return [m.id for m in backend.to_apply(read_migrations(str(MIGRATIONS_DIR)))]


def require_current_schema(database_url: str) -> None:
    """Raise SchemaMissing, naming what is missing, unless every migration is applied: a
    worker of a newer release must not start on an older schema and fail at its first publish."""
    pending = pending_migrations(database_url)
    if pending:
        raise SchemaMissing(f"the metastore schema is out of date ({', '.join(pending)} not applied): "
                            "run `ingest migrate` first")
