"""``ingest status``, ``health``, ``segments`` and ``gaps list | ack``: what a source has done
and what stopped it, read from the metastore (and Kafka's watermarks)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

from ingest.cli.common import emit, load_settings
from ingest.config import positive_int
from ingest.errors import ConfigError
from metastore import Metastore


def _since(value: str) -> datetime:
    """``--since``: an ISO 8601 time (UTC unless it says otherwise) or an age such as 30m, 2h."""
    from ingest.spec.parse import parse_duration

    if re.fullmatch(r"\d+(\.\d+)?(ms|s|m|h)", value):
        return datetime.now(UTC) - timedelta(seconds=parse_duration("--since", value))
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"--since: expected a time such as 2026-11-25T04:00:00Z or an age such as 30m, got {value!r}"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def cmd_segments(args: argparse.Namespace) -> int:
    from ingest.ops.status import source_segments

    since = _since(args.since) if args.since else None
    limit = positive_int("--limit", args.limit, maximum=10**9) if args.limit is not None else None
    with Metastore(load_settings().database_url) as store:
        segments = source_segments(store, args.source, since, limit)
    if args.json:
        emit(args, {"source": args.source, "segments": segments})
        return 0
    print(f"{'id':>6} {'rows':>9} {'rejects':>7} {'skipped':>7}  ranges  files")
    for s in segments:
        ranges = ", ".join(f"{r['topic']}[{r['partition']}] [{r['start']}, {r['end']})" for r in s["ranges"])
        print(
            f"{s['id']:>6} {s['rows']:>9} {s['rejects']:>7} {s['skipped']:>7}  {ranges}  "
            + " ".join(s["files"] + s["rejects_files"])
        )
    print(f"{len(segments)} segment(s), {sum(s['rows'] for s in segments)} row(s)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ingest.ops.status import source_status
    from ingest.ops.status_text import render as render_status

    settings = load_settings()
    with Metastore(settings.database_url) as store:
        status = source_status(store, settings, args.source)
    emit(args, status, render_status(status))
    return 0


def cmd_gaps_list(args: argparse.Namespace) -> int:
    from ingest.ops.status import source_gaps
    from ingest.ops.status_text import gap_line

    with Metastore(load_settings().database_url) as store:
        gaps = source_gaps(store, args.source)
    if args.json:
        emit(args, {"source": args.source, "gaps": gaps})
        return 0
    for g in gaps:
        print(gap_line(g))
    print(f"{len(gaps)} gap(s), {sum(1 for g in gaps if g['acknowledged_at'] is None)} unacknowledged")
    return 0


def cmd_gaps_ack(args: argparse.Namespace) -> int:
    import getpass

    if not args.all and not args.id:
        raise ConfigError("gaps ack: name the gaps with --id N (repeatable) or pass --all")
    by = args.by or getpass.getuser()
    with Metastore(load_settings().database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        acked = store.acknowledge_gaps(args.source, by, None if args.all else args.id)
    emit(
        args,
        {"source": args.source, "acknowledged": list(acked), "by": by},
        [
            f"acknowledged {len(acked)} gap(s) of {args.source} as {by}"
            + (f": {', '.join(map(str, acked))}" if acked else "")
        ],
    )
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the source is healthy, 1 when not (for probes and scripts)."""
    from ingest.ops.status import source_status

    settings = load_settings()
    with Metastore(settings.database_url) as store:
        status = source_status(store, settings, args.source, errors=0)
    healthy = status["state"] != "UNHEALTHY"
    emit(
        args,
        {
            "source": args.source,
            "healthy": healthy,
            "state": status["state"],
            "detailed_state": status["detailed_state"],
        },
        [f"{args.source}: {'healthy' if healthy else 'unhealthy'} ({status['state']}, {status['detailed_state']})"],
    )
    return 0 if healthy else 1


def cmd_audit(args: argparse.Namespace) -> int:
    """One line per finding and a summary; exit 1 on any finding. The result is stored."""
    from ingest.ops.audit import Finding, FindingKind, audit_source, record_result

    settings = load_settings()
    with Metastore(settings.database_url) as store:
        result, snapshot = audit_source(store, args.source, files=args.files)
        if args.files and snapshot.tables:  # pyiceberg is imported only for a source with a table
            from ingest.table.audit import table_findings

            result.tables, found = table_findings(settings.database_url, args.source, snapshot)
            result.findings += [Finding(FindingKind(kind), where, detail) for kind, where, detail in found]
        record_result(store, result)
    emit(args, result.document(), [*(f.line() for f in result.findings), result.summary()])
    return 0 if result.ok else 1
