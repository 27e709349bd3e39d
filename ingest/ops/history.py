"""``ingest source history``: every applied version of a source's spec, with what changed."""

from __future__ import annotations

from typing import Any

from ingest_common.redact import redact_value
from metastore import Metastore


def spec_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Short, human-readable differences between two stored specs (``to_json`` documents)."""
    if old is None:
        return ["created"]
    changes: list[str] = []
    old_schema = {c[0]: c[1] for c in old.get("schema", [])}
    new_schema = {c[0]: c[1] for c in new.get("schema", [])}
    for column, kind in new_schema.items():
        if column not in old_schema:
            changes.append(f"+column {column} {kind}")
        elif old_schema[column] != kind:
            changes.append(f"column {column}: {old_schema[column]} -> {kind}")
    changes.extend(f"-column {column}" for column in old_schema if column not in new_schema)
    flat_old, flat_new = _flatten(old), _flatten(new)
    for key in sorted(set(flat_old) | set(flat_new)):
        if key != "schema" and flat_old.get(key) != flat_new.get(key):
            changes.append(f"{key}: {flat_old.get(key)!r} -> {flat_new.get(key)!r}")
    return changes or ["no change"]


def _flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def source_history(store: Metastore, source: str) -> list[dict[str, Any]]:
    out = []
    previous: dict[str, Any] | None = None
    for row in store.spec_versions(source):
        # Specs applied before store URIs refused embedded credentials may still carry them.
        spec = redact_value(row["spec"])
        out.append(
            {
                "version": int(row["version"]),
                "applied_at": row["applied_at"].isoformat(),
                "changes": spec_changes(previous, spec),
            }
        )
        previous = spec
    return out
