"""What ``ingest source apply`` refuses when an Avro source's reader schema changes, or the
``[table]`` mode, key or envelope of any source does.

A source's segments, and its Iceberg table, are read as one schema: each column keeps one
type across spec versions. So a new version of a ``format = "avro"`` spec (whether its
reader schema comes from ``[schema]`` or from the registry's latest version) is refused, with
one line, when:

- a column both versions have changes type other than by the widening Iceberg and Parquet
  readers accept (``int`` to ``long``, ``float`` to ``double``, a decimal's precision raised,
  a struct gaining fields, at any depth: ingest.formats.types.widens); or
- the previous reader schema came from the registry (a schema writers used) and the new
  reader schema cannot resolve records written with it by Avro's rules
  (ingest.formats.avro_resolution): e.g. a registry version adding a field without a default, which
  would make every record written so far an ``unresolvable_writer_schema`` reject.

Adding columns (a field with a default, or any ``[schema]`` column, which is nullable) and
dropping columns are allowed: older rows read an added column as null, later rows a dropped
one. Other formats and a first version are not checked here (the table committer still stops
at a change Iceberg refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ingest.errors import ConfigError
from ingest.formats.avro import decode_schemas
from ingest.formats.avro_resolution import resolution_problem
from ingest.formats.types import widens
from ingest.spec.model import SourceSpec


def evolution_problem(previous: SourceSpec, new: SourceSpec) -> str | None:
    """Why ``new`` cannot follow ``previous`` as the source's next spec version, or None."""
    if (previous.table.mode, previous.table.key, previous.table.envelope) != (
        new.table.mode,
        new.table.key,
        new.table.envelope,
    ):
        # An upsert table's rows are named by its key; the log's table holds every record.
        return (
            f"[table] mode, key or envelope changes (from {previous.table.mode.value} {list(previous.table.key)} "
            f"to {new.table.mode.value} {list(new.table.key)}): the source's table is either the log of its "
            "records or the last state per one key; apply it as a new source"
        )
    if previous.format != "avro" or new.format != "avro" or not previous.reader_schema:
        return None
    before = dict(previous.schema)
    for column, ctype in new.schema:
        old = before.get(column)
        if old is not None and not widens(old, ctype):
            return (
                f"column {column!r} changes type from {old} to {ctype}: earlier segments and the table "
                "could no longer be read as one schema (allowed: adding or dropping columns or struct fields, "
                "int to long, float to double, a decimal's precision raised; or apply it as a new source)"
            )
    if previous.schema_from != "registry":
        # A spec's reader schema (every field nullable) is no schema a writer used.
        return None
    problem = resolution_problem(*decode_schemas(new.reader_schema, previous.reader_schema))
    if problem is not None:
        return f"the new reader schema cannot read records written with the previous one: {problem}"
    return None


def evolution_guard(new: SourceSpec) -> Callable[[int, dict[str, Any]], None]:
    """What ``Metastore.apply_source(follows=...)`` runs against the latest stored version,
    inside the apply's transaction: raises ConfigError (one line) when ``new`` may not follow it."""

    def follows(version: int, doc: dict[str, Any]) -> None:
        problem = evolution_problem(SourceSpec.from_json(doc), new)
        if problem is not None:
            raise ConfigError(f"source {new.name}: refused against version {version}: {problem}")

    return follows
