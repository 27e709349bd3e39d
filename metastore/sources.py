"""Sources: spec versions, desired states (controls), and the workers' heartbeats and errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg.types.json import Jsonb

from ingest_common.errors import ConfigError
from ingest_common.model import DesiredState, LastAudit, SourceControl
from ingest_common.redact import redact
from ingest_common.store_uri import canonical_store_uri, overlap
from metastore.base import Row, StoreBase
from metastore.connection import wrap_exceptions
from metastore.errors import (
    GroupTaken,
    SourceNotFound,
    SourceTerminated,
    StoreOverlap,
)
from metastore.queries import query


class SourcesMixin(StoreBase):
    """Apply and read specs (store and group uniqueness checked across sources), set and read
    controls, record heartbeats and errors."""

    def apply_source(
        self,
        name: str,
        spec: dict[str, Any],
        spec_text: str,
        reactivate: bool = False,
        follows: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> tuple[int, bool]:
        """Store a new version of the spec unless it equals the latest. Returns (version, changed).

        A terminated source refuses (SourceTerminated) unless ``reactivate``: then it is set
        running again (its history, segments and offsets are kept). ``follows(version, spec)``
        sees the latest stored version under the same locks that store the new one, so no
        other apply lands between its check and this version; whatever it raises refuses the
        apply and stores nothing."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                # Checks across sources see every other source's applies, not a snapshot.
                conn.execute(query("lock_applies"))
                if isinstance(spec.get("segment_store"), str):
                    _check_store_overlap(conn, name, spec["segment_store"])
                _check_group_unique(conn, name, str(spec.get("consumer_group") or ""))
                current = conn.execute(query("lock_source"), {"name": name}).fetchone()
                if current is not None:
                    if current["desired_state"] == DesiredState.TERMINATED:
                        if not reactivate:
                            raise SourceTerminated(name)
                        conn.execute(query("reactivate_source"), {"name": name})
                    latest = conn.execute(query("latest_spec"), {"name": name}).fetchone()
                    if latest is not None and latest["spec"] == json.loads(json.dumps(spec)):
                        return int(latest["version"]), False
                    if latest is not None and follows is not None:
                        follows(int(latest["version"]), latest["spec"])
                row = conn.execute(query("upsert_source"), {"name": name}).fetchone()
                assert row is not None
                version = int(row["version"])
                conn.execute(
                    query("insert_source_version"),
                    {"name": name, "version": version, "spec": Jsonb(spec), "spec_text": spec_text},
                )
                return version, True

    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]:
        rows = self._fetch("latest_spec", name=name)
        if not rows:
            raise SourceNotFound(name)
        return int(rows[0]["version"]), cast(dict[str, Any], rows[0]["spec"])

    def list_sources(self) -> list[Row]:
        return self._fetch("list_sources")

    def spec_versions(self, name: str) -> list[Row]:
        """Every applied version of a source's spec, oldest first."""
        rows = self._fetch("list_versions", name=name)
        if not rows:
            raise SourceNotFound(name)
        return rows

    def set_control(self, source: str, state: DesiredState, stay: bool = False) -> None:
        if not self._fetch("set_control", name=source, state=state, stay=stay):
            current = self.control(source)  # SourceNotFound for an unknown source
            raise SourceTerminated(source, current.desired_state)

    def mark_terminated(self, source: str) -> bool:
        """terminating -> terminated (after the drain). False if the source is not terminating."""
        return bool(self._fetch("mark_terminated", name=source))

    def control(self, source: str) -> SourceControl:
        rows = self._fetch("get_control", name=source)
        if not rows:
            raise SourceNotFound(source)
        row = rows[0]
        return SourceControl(
            DesiredState(row["desired_state"]),
            bool(row["drain_stay"]),
            int(row["reset_generation"]),
            int(row["version"]),
            None
            if row["audit_finished_at"] is None
            else LastAudit(int(row["audit_findings"]), row["audit_finished_at"]),
        )

    def heartbeat(
        self,
        source: str,
        worker: str,
        host: str,
        pid: int,
        version: str,
        state: str,
        partitions: Sequence[str],
        spec_version: int | None = None,
        *,
        started_at: datetime | None = None,
        registry_waiting: Sequence[str] = (),
        registry_error: str | None = None,
    ) -> None:
        with wrap_exceptions(self.url):
            conn = self._connection()
            conn.execute(
                query("heartbeat"),
                {
                    "source": source,
                    "worker": worker,
                    "host": host,
                    "pid": pid,
                    "version": version,
                    "state": state,
                    "partitions": list(partitions),
                    "spec_version": spec_version,
                    "started_at": started_at,
                    "registry_waiting": list(registry_waiting),
                    "registry_error": None if registry_error is None else redact(registry_error)[:2000],
                },
            )
            # Rows of workers dead for a day are only noise.
            conn.execute(query("expire_workers"), {"keep_s": 86_400})

    def live_workers(self, source: str, expiry_s: float = 30.0) -> list[Row]:
        return self._fetch("live_workers", source=source, expiry_s=expiry_s)

    def record_error(self, source: str, worker: str, kind: str, message: str) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute(
                query("record_error"),
                {"source": source, "worker": worker, "kind": kind, "message": redact(message)[:2000]},
            )

    def recent_errors(self, source: str, limit: int = 10) -> list[Row]:
        return self._fetch("recent_errors", source=source, limit=limit)


def _source_root(store: str, name: str) -> str:
    """Where a source's files lie: ``<store>/<name>`` (ingest/segments/store.py)."""
    try:
        store = canonical_store_uri(store)
    except ConfigError:  # a store stored before URIs were validated: compare it as written
        store = store.rstrip("/")
    return f"{store}/{name}"


def _check_store_overlap(conn: psycopg.Connection[Row], name: str, store: str) -> None:
    """Refuse a store whose source directory overlaps another source's (any version of
    it): one source's gc or cleanup could otherwise reach the other's files."""
    root = _source_root(store, name)
    for row in conn.execute(query("other_stores"), {"name": name}).fetchall():
        if row["segment_store"] is None:
            continue
        other_root = _source_root(str(row["segment_store"]), str(row["source"]))
        if overlap(root, other_root):
            raise StoreOverlap(name, root, str(row["source"]), other_root)


def group_id(name: str, consumer_group: str) -> str:
    """The Kafka group a source's workers join (``SourceSpec.group_id``)."""
    return consumer_group or f"ingest-{name}"


def _check_group_unique(conn: psycopg.Connection[Row], name: str, consumer_group: str) -> None:
    """Refuse a group another source (any state, terminated too: its group's committed
    offsets are its own) already joins."""
    mine = group_id(name, consumer_group)
    for row in conn.execute(query("other_groups"), {"name": name}).fetchall():
        if group_id(str(row["source"]), str(row["consumer_group"])) == mine:
            raise GroupTaken(name, mine, str(row["source"]))
