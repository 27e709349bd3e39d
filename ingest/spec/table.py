"""The ``[table]`` section of a source spec: which Iceberg catalog holds the source's tables.

Without it (or without ``catalog``) the tables are in pyiceberg's SQL catalog in the metastore's
own PostgreSQL (``ingest.table.catalog.MetastoreCatalog``). With ``catalog = { type = "rest",
uri = "...", ... }`` they are in that catalog: any catalog pyiceberg loads by type (``rest``,
``glue``, ``hive``, ``sql``, ``dynamodb``, ``bigquery``), given pyiceberg's own properties.

A spec is stored in the metastore and shown by ``source history``: it never holds a secret. A
property whose name says it is one (``token``, ``credential``, ``s3.secret-access-key``, an
``Authorization`` header...) or a ``uri`` with a password is refused in the spec; it comes from
the environment of the processes that open the catalog (the committer, ``table-enable``,
``table``, ``query``, ``audit``): ``INGEST_TABLE_CATALOG__<NAME>``, pyiceberg's spelling of a
property in a variable (``__`` for ``.``, ``_`` for ``-``: ``INGEST_TABLE_CATALOG__TOKEN``,
``INGEST_TABLE_CATALOG__S3__SECRET_ACCESS_KEY``), or a file named by the same variable with
``_FILE`` appended (a mounted secret). No pyiceberg here: the spec is parsed by every command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ingest_common.errors import ConfigError, refuse_unknown_fields, shown
from ingest_common.redact import is_secret_name

CATALOG_TYPES = ("rest", "glue", "hive", "sql", "dynamodb", "bigquery")
CATALOG_ENV_PREFIX = "INGEST_TABLE_CATALOG__"
FILE_SUFFIX = "_FILE"
_TABLE_KEYS = {"catalog", "mode", "key", "envelope"}
# An upsert source's segments carry each record's change in this column: UPSERT (the row is
# the key's new state) or DELETE (a tombstone, or a Debezium "d"); the table holds no such column.
OP_COLUMN = "_op"
OP_UPSERT = "u"
OP_DELETE = "d"


class TableMode(StrEnum):
    # The data table is the log of records, every one appended once.
    APPEND = "append"
    # The data table is the current state per key: each segment's changes merged in once.
    UPSERT = "upsert"


class Envelope(StrEnum):
    # The value is the row; a null value (tombstone) deletes its key.
    NONE = "none"
    # Debezium's change event: op c/u/r upsert ``after``, op d deletes ``before``'s key.
    DEBEZIUM = "debezium"


# Secrets whose property names the redaction's pattern does not know as secret.
_SECRET_SUFFIXES = ("authorization",)


def is_secret_property(name: str) -> bool:
    """Whether a catalog property holds a secret (never in a spec; hidden wherever it appears)."""
    return is_secret_name(name) or name.lower().endswith(_SECRET_SUFFIXES)


@dataclass(frozen=True, slots=True)
class TableSettings:
    """``catalog``: the catalog's properties (``type`` among them), sorted by name; empty: the
    metastore's own SQL catalog."""

    catalog: tuple[tuple[str, str], ...] = ()
    mode: TableMode = TableMode.APPEND
    # Upsert: the columns (value columns, or the decoded key's ``_key_...``) that name a row.
    key: tuple[str, ...] = ()
    envelope: Envelope = Envelope.NONE

    @property
    def external(self) -> bool:
        return bool(self.catalog)

    def describe(self) -> str:
        """The catalog in a few words for error lines: its type and where it is."""
        if not self.catalog:
            return "the metastore's Iceberg catalog"
        props = dict(self.catalog)
        where = props.get("uri") or props.get("warehouse") or ""
        return f"the {props['type']} catalog" + (f" at {where}" if where else "")

    @property
    def upsert(self) -> bool:
        return self.mode is TableMode.UPSERT

    def to_json(self) -> dict[str, Any]:
        return {
            "catalog": dict(self.catalog),
            "mode": self.mode.value,
            "key": list(self.key),
            "envelope": self.envelope.value,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> TableSettings:
        # Specs stored before the section existed: the metastore's catalog; before upsert: append.
        doc = doc or {}
        return cls(
            tuple(sorted(doc.get("catalog", {}).items())),
            TableMode(doc.get("mode", TableMode.APPEND)),
            tuple(doc.get("key", ())),
            Envelope(doc.get("envelope", Envelope.NONE)),
        )


def table_from_dict(doc: object) -> TableSettings:
    """The ``[table]`` section, validated: ``catalog`` an inline table of pyiceberg catalog
    properties with a known ``type`` and no secret; ``mode``, and with ``upsert`` its ``key``
    and ``envelope``."""
    if not isinstance(doc, dict):
        raise ConfigError('table: expected a table, e.g. [table] catalog = { type = "rest", uri = "..." }')
    refuse_unknown_fields("table", doc, _TABLE_KEYS)
    mode, key, envelope = _mode_key_envelope(doc)
    catalog = tuple(sorted(_catalog(doc["catalog"]).items())) if "catalog" in doc else ()
    return TableSettings(catalog, mode, key, envelope)


def _mode_key_envelope(doc: Mapping[str, object]) -> tuple[TableMode, tuple[str, ...], Envelope]:
    """``mode``, ``key`` and ``envelope`` on their own (whether the key's columns exist, and
    how a tombstone finds them, depends on the rest of the spec: ingest.spec.parse)."""
    modes = tuple(m.value for m in TableMode)
    envelopes = tuple(e.value for e in Envelope)
    mode = doc.get("mode", TableMode.APPEND.value)
    if mode not in modes:
        raise ConfigError(f"table.mode: {shown(mode)} is not one of {', '.join(modes)}")
    envelope = doc.get("envelope", Envelope.NONE.value)
    if envelope not in envelopes:
        raise ConfigError(f"table.envelope: {shown(envelope)} is not one of {', '.join(envelopes)}")
    if mode == TableMode.APPEND:
        for given in ("key", "envelope"):
            if given in doc:
                raise ConfigError(
                    f'table.{given}: only with mode = "upsert" (an append table keeps every record; '
                    "no key or envelope applies)"
                )
        return TableMode.APPEND, (), Envelope.NONE
    key = doc.get("key")
    if (
        not isinstance(key, list)
        or not key
        or not all(isinstance(column, str) and column for column in key)
        or len(set(key)) != len(key)
    ):
        raise ConfigError(
            'table.key: mode = "upsert" needs the columns that name a row, a non-empty list of distinct '
            f'column names such as ["id"], got {shown(key)}'
        )
    return TableMode(mode), tuple(key), Envelope(envelope)


def _catalog(catalog: object) -> dict[str, str]:
    """``catalog``: pyiceberg catalog properties with a known ``type`` and no secret."""
    if not isinstance(catalog, dict) or not catalog:
        raise ConfigError(
            'table.catalog: expected a table of pyiceberg catalog properties, e.g. { type = "rest", uri = "..." }'
        )
    props: dict[str, str] = {}
    for key, value in catalog.items():
        field = f"table.catalog.{key}"
        if isinstance(value, bool):
            props[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            props[key] = str(value)
        else:
            raise ConfigError(f"{field}: expected a string, number or boolean, got {shown(value)}")
        if is_secret_property(key):
            raise ConfigError(
                f"{field}: a secret is never written in a spec (specs are stored and shown); "
                f"set {env_name(key)} (or {env_name(key)}{FILE_SUFFIX}, a file holding it) "
                "where the committer runs"
            )
    kind = props.get("type", "")
    if kind not in CATALOG_TYPES:
        raise ConfigError(f"table.catalog.type: {shown(catalog.get('type'))} is not one of {', '.join(CATALOG_TYPES)}")
    uri = props.get("uri", "")
    if ":" in uri.partition("://")[2].partition("/")[0].rpartition("@")[0]:
        raise ConfigError(
            f"table.catalog.uri: a password is never written in a spec; set {env_name('uri')} "
            f"(or {env_name('uri')}{FILE_SUFFIX}) to the URI with its password where the committer runs"
        )
    return props


def env_name(prop: str) -> str:
    """The variable that gives catalog property ``prop`` (pyiceberg's spelling: ``.`` -> ``__``,
    ``-`` -> ``_``): ``s3.secret-access-key`` -> ``INGEST_TABLE_CATALOG__S3__SECRET_ACCESS_KEY``."""
    return CATALOG_ENV_PREFIX + prop.replace(".", "__").replace("-", "_").upper()


def catalog_env(env: Mapping[str, str]) -> dict[str, str]:
    """The catalog properties the environment gives: ``INGEST_TABLE_CATALOG__<NAME>`` holds a
    value, ``INGEST_TABLE_CATALOG__<NAME>_FILE`` names a file holding it (its text without the
    trailing newline)."""
    props: dict[str, str] = {}
    for variable, value in sorted(env.items()):
        if not variable.startswith(CATALOG_ENV_PREFIX) or len(variable) == len(CATALOG_ENV_PREFIX):
            continue
        name = variable[len(CATALOG_ENV_PREFIX) :]
        if name.endswith(FILE_SUFFIX):
            name = name[: -len(FILE_SUFFIX)]
            try:
                value = Path(value).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(f"{variable}: cannot read {value}: {exc.strerror}") from exc
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{variable}: {value} is not UTF-8 text (byte {exc.start})") from exc
        props[name.lower().replace("__", ".").replace("_", "-")] = value
    return props
