"""metastore/schema.sql is what the migrations produce, exactly (regenerate it with
``python -m ingest_dev.schema write`` after adding a migration)."""

from __future__ import annotations

from ingest_dev.schema import SCHEMA_FILE, dump_schema


def test_the_migrations_produce_exactly_the_schema_snapshot(database_url: str) -> None:
    dumped = dump_schema(database_url)
    assert dumped.splitlines() == SCHEMA_FILE.read_text().splitlines(), (
        "metastore/schema.sql is stale: run python -m ingest_dev.schema write"
    )
