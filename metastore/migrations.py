"""Schema migrations: plain SQL files in ``migrations/`` applied with yoyo."""

from __future__ import annotations

from pathlib import Path

from yoyo import get_backend, read_migrations

from metastore.connection import wrap_exceptions

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def yoyo_url(database_url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix):]
    return database_url


def apply_migrations(database_url: str) -> list[str]:
    """Apply every pending migration; returns the ids applied (empty: already up to date)."""
    with wrap_exceptions(database_url):
        backend = get_backend(yoyo_url(database_url))
        try:
            migrations = read_migrations(str(MIGRATIONS_DIR))
            with backend.lock():
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
            return [m.id for m in pending]
        finally:
            backend.connection.close()
