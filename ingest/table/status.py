"""``ingest table SOURCE`` and ``ingest query SOURCE 'SQL'``: what the tables hold, and a quick
look at them with DuckDB over a pyiceberg scan (the table's committed snapshot only)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ingest.spec.model import SourceSpec
from ingest.table.catalog import close_catalog, identifier, open_catalog
from ingest.table.committer import COMMIT_SEQ
from ingest.table.errors import QueryFailed, TableError
from ingest_common.errors import first_line
from metastore.tables import TableKind, TableNotEnabled, TableStore
from metastore.upserts import UpsertStore


def table_status(database_url: str, source: str) -> dict[str, Any]:
    """Per table of the source: the last committed segment, segments behind, location and the
    last commit (``--json`` has the same fields)."""
    tables: list[dict[str, Any]] = []
    with UpsertStore(database_url) as store:
        spec = SourceSpec.from_json(store.latest_spec(source))  # SourceNotFound for an unknown source
        rows = store.tables(source)
        if not rows:
            raise TableNotEnabled(source)
        catalog = open_catalog(database_url, spec.table)
        refusals = store.refusals(source)
        try:
            for row in rows:
                last, appended = store.last_segment(source, row.kind)
                upsert = None
                if row.kind is not TableKind.DATA or not spec.table.upsert:
                    behind, oldest = store.behind(source, row.kind)
                else:
                    state = store.upsert_state(source)
                    pending = store.pending_ranges(source, state.offsets, 1000)
                    behind = len(pending)
                    oldest = min((r.published_at for r in pending), default=None)
                    upsert = {
                        "key": list(spec.table.key),
                        "envelope": spec.table.envelope.value,
                        "merged_offsets": dict(state.offsets),
                        "cross_partition_keys": state.cross_partition_keys,
                    }
                name = ".".join(identifier(source, row.kind))
                location = None
                held_seq = None
                snapshot_id = None
                if catalog.table_exists(identifier(source, row.kind)):
                    table = catalog.load_table(identifier(source, row.kind))
                    location = table.location()
                    held_seq = int(table.properties.get(COMMIT_SEQ, "0"))
                    snapshot = table.current_snapshot()
                    snapshot_id = snapshot.snapshot_id if snapshot else None
                tables.append(
                    {
                        "table": row.kind.value,
                        "name": name,
                        "partition_by": row.partition_by,
                        "location": location,
                        "last_committed_segment": last,
                        "segments_appended": appended,
                        "segments_behind": behind,
                        "oldest_behind_published_at": oldest.isoformat() if oldest else None,
                        "commits": row.committed_seq,
                        "table_commit_seq": held_seq,
                        "snapshot_id": snapshot_id,
                        "last_commit_at": row.last_commit_at.isoformat() if row.last_commit_at else None,
                        "mode": spec.table.mode.value if row.kind is TableKind.DATA else "append",
                        "upsert": upsert,
                        # Pending segments it cannot take (ingest.table.refusals).
                        "refused_segments": [
                            {"segment_id": r["segment_id"], "error": r["error"], "attempts": r["attempts"]}
                            for r in refusals
                            if r["kind"] == row.kind.value
                        ],
                    }
                )
        finally:
            close_catalog(catalog)
    return {"source": source, "tables": tables}


def render(status: dict[str, Any]) -> list[str]:
    lines = []
    for t in status["tables"]:
        last = t["last_committed_segment"]
        at = t["last_commit_at"]
        ago = ""
        if at:
            seconds = (datetime.now(UTC) - datetime.fromisoformat(at)).total_seconds()
            ago = f" ({seconds:.0f} s ago)"
        lines.append(
            f"{t['name']} ({t['table']}, partition by {t['partition_by']}): "
            f"last committed segment {last if last is not None else '-'}, "
            f"{t['segments_behind']} segment(s) behind, {t['commits']} commit(s), "
            f"last commit {at or '-'}{ago}"
        )
        lines.append(f"  location {t['location'] or '- (created with the first commit)'}")
        if (upsert := t.get("upsert")) is not None:
            offsets = ", ".join(f"{k} {v}" for k, v in sorted(upsert["merged_offsets"].items())) or "-"
            lines.append(f"  upsert by {', '.join(upsert['key'])}: merged up to {offsets}")
            if upsert["cross_partition_keys"]:
                lines.append(
                    f"  {upsert['cross_partition_keys']} key(s) appeared on more than one partition: their order "
                    "is undefined (the newest Kafka timestamp wins); `ingest audit` reports them"
                )
        for r in t.get("refused_segments", []):
            lines.append(
                f"  segment {r['segment_id']} refused ({r['attempts']} attempt(s)): {r['error']}; "
                "pending, retried by the committer"
            )
        if t["table_commit_seq"] is not None and t["table_commit_seq"] != t["commits"]:
            lines.append(
                f"  the table holds commit {t['table_commit_seq']}, the metastore recorded {t['commits']}: "
                "the committer reconciles this at its next pass"
            )
    return lines


def run_query(database_url: str, source: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` in DuckDB with the source's tables as views: the data table under the source's
    name (``-`` written as ``_``) and the rejects table, if any, as ``<name>_rejects``. Each view
    is the table's committed snapshot read whole through pyiceberg (a quick look, not a query
    engine for large tables)."""
    import duckdb

    view = source.replace("-", "_")
    with TableStore(database_url) as store:
        spec = SourceSpec.from_json(store.latest_spec(source))
        kinds = [row.kind for row in store.tables(source)]
    if not kinds:
        raise TableNotEnabled(source)
    catalog = open_catalog(database_url, spec.table)
    try:
        conn = duckdb.connect()
        registered = []
        for kind in kinds:
            name = view if kind is TableKind.DATA else f"{view}_rejects"
            if catalog.table_exists(identifier(source, kind)):
                arrow = catalog.load_table(identifier(source, kind)).scan().to_arrow()
                conn.register(name, arrow)
                registered.append(name)
        if not registered:
            raise TableError(
                f"source {source!r} has no Iceberg table yet: it is created by the first commit "
                f"(`ingest table-commit {source}`)"
            )
        try:
            result = conn.execute(sql)
            columns = [d[0] for d in result.description or ()]
            return columns, [tuple(r) for r in result.fetchall()]
        except duckdb.Error as exc:
            raise QueryFailed(f"query over {', '.join(registered)}: {first_line(exc)}") from exc
    finally:
        close_catalog(catalog)


def format_rows(columns: list[str], rows: list[tuple[Any, ...]]) -> list[str]:
    cells = [columns, *[["NULL" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells] + [
        f"({len(rows)} row{'s' if len(rows) != 1 else ''})"
    ]
