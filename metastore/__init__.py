"""All PostgreSQL access: offsets, serials, sources and published segments."""

from metastore.connection import redact_url
from metastore.errors import (
    CommitOutcomeUnknown,
    MetastoreError,
    MetastoreUnavailable,
    PublishConflict,
    SchemaMissing,
    SourceNotFound,
)
from metastore.migrations import apply_migrations
from metastore.store import Metastore

__all__ = [
    "CommitOutcomeUnknown",
    "Metastore",
    "MetastoreError",
    "MetastoreUnavailable",
    "PublishConflict",
    "SchemaMissing",
    "SourceNotFound",
    "apply_migrations",
    "redact_url",
]
