"""All PostgreSQL access: offsets, serials, sources and published segments."""

from metastore.connection import redact_url
from metastore.errors import (
    CommitOutcomeUnknown,
    InvalidReset,
    MetastoreError,
    MetastoreUnavailable,
    PublishConflict,
    ReplaceRefused,
    SchemaMissing,
    SourceNotFound,
    SourceTerminated,
)
from metastore.migrations import apply_migrations
from metastore.store import Metastore

__all__ = [
    "CommitOutcomeUnknown",
    "InvalidReset",
    "Metastore",
    "MetastoreError",
    "MetastoreUnavailable",
    "PublishConflict",
    "ReplaceRefused",
    "SchemaMissing",
    "SourceNotFound",
    "SourceTerminated",
    "apply_migrations",
    "redact_url",
]
