"""``ingest table-enable``, ``table``, ``table-commit`` and ``query``: the Iceberg tables
(:mod:`ingest.table`), their commands, flags and examples."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from ingest.cli.common import emit, load_settings
from ingest.config import non_negative_seconds, positive_int
from ingest.logs import configure_logging


def cmd_table_enable(args: argparse.Namespace) -> int:
    from ingest.table.config import PartitionBy, RejectsMode
    from ingest.table.enable import enable_table

    partition_by = None if args.partition_by is None else PartitionBy(args.partition_by)
    done = enable_table(load_settings().database_url, args.source, partition_by, RejectsMode(args.rejects))
    emit(
        args,
        {"source": args.source, "tables": [{"table": kind.value, "enabled": new} for kind, new in done]},
        [
            f"source {args.source}: {kind.value} table " + ("enabled" if new else "already enabled (unchanged)")
            for kind, new in done
        ]
        + [f"run `ingest table-commit {args.source}` to append the published segments"],
    )
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from ingest.table.status import render, table_status

    status = table_status(load_settings().database_url, args.source)
    emit(args, status, render(status))
    return 0


def cmd_table_commit(args: argparse.Namespace) -> int:
    from ingest.ops.endpoints import Endpoints
    from ingest.table.committer import TableCommitter
    from ingest.table.config import CommitSettings
    from ingest.table.runner import run_committer

    settings = load_settings()
    commit_settings = CommitSettings(
        batch_segments=positive_int("--batch-segments", args.batch_segments, maximum=1000),
        interval_s=non_negative_seconds("--interval", args.interval),
        keep_snapshots=positive_int("--keep-snapshots", args.keep_snapshots, maximum=100_000),
        pass_deadline_s=settings.table_pass_deadline_s,
    )
    # Logs go to stderr, --once's too: its stdout is its result (--json: one document).
    configure_logging(settings.log_format)
    with TableCommitter(settings.database_url, args.source, commit_settings) as committer:
        if args.once:
            results = committer.commit_all()
            # Segments the tables cannot take: left pending (exit 1), the others committed.
            refused = [(k, i, e) for k in committer.kinds() for i, e in committer.refusals.of(k).items()]
            emit(
                args,
                {
                    "source": args.source,
                    "commits": [
                        {
                            "table": r.kind.value,
                            "seq": r.seq,
                            "segments": list(r.segment_ids),
                            "files": r.files,
                            "seconds": round(r.seconds, 4),
                            "conflicts": r.conflicts,
                        }
                        for r in results
                    ],
                    "refused": [{"table": k.value, "segment_id": i, "error": e} for k, i, e in refused],
                },
                [
                    f"{r.kind.value} commit {r.seq}: segments {r.segment_ids[0]}..{r.segment_ids[-1]} "
                    f"({len(r.segment_ids)}), {r.files} file(s), {r.seconds * 1000:.0f} ms"
                    for r in results
                ]
                + [f"{k.value} table refused segment {i} (left pending): {e}" for k, i, e in refused]
                or [f"source {args.source}: nothing to commit"],
            )
            return 1 if refused else 0
        stop = threading.Event()

        def _stop(signum: int, _frame: Any) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        committer.kinds()  # TableError at once for a source with no table
        endpoints = None
        if settings.metrics_port is not None:
            health = committer.health
            endpoints = Endpoints(committer.metrics.registry, health.healthy, health.ready)
            endpoints.serve(settings.metrics_host, settings.metrics_port)
        try:
            run_committer(committer, stop)
        finally:
            if endpoints is not None:
                endpoints.close()
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from ingest.table.status import format_rows, run_query

    columns, rows = run_query(load_settings().database_url, args.source, args.sql)
    emit(
        args,
        {"source": args.source, "columns": columns, "rows": [list(r) for r in rows]},
        format_rows(columns, rows),
    )
    return 0


def add_table_commands(sub: Any) -> None:
    from ingest.table.config import (
        DEFAULT_BATCH_SEGMENTS,
        DEFAULT_INTERVAL_S,
        DEFAULT_KEEP_SNAPSHOTS,
        PartitionBy,
        RejectsMode,
    )

    enable = sub.add_parser("table-enable", help="append the source's published segments to an Iceberg table")
    enable.add_argument("source")
    enable.add_argument(
        "--partition-by",
        choices=[p.value for p in PartitionBy],
        default=None,
        help="partition transform of the event-time column (default: the spec's file_partition; the "
        "spec must cut files by it or a finer transform, see docs/iceberg.md)",
    )
    enable.add_argument(
        "--rejects",
        choices=[m.value for m in RejectsMode],
        default=RejectsMode.TABLE.value,
        help="rejects go to a table of their own, or nowhere (default: %(default)s)",
    )
    enable.set_defaults(func=cmd_table_enable)

    table = sub.add_parser("table", help="the source's Iceberg tables: last committed segment, segments behind")
    table.add_argument("source")
    table.set_defaults(func=cmd_table)

    commit = sub.add_parser("table-commit", help="run the table committer (one per source holds the lock)")
    commit.add_argument("source")
    commit.add_argument("--once", action="store_true", help="commit every pending segment once, then exit")
    commit.add_argument(
        "--batch-segments",
        default=str(DEFAULT_BATCH_SEGMENTS),
        help="most segments per commit; this many pending commit at once (default: %(default)s)",
    )
    commit.add_argument(
        "--interval",
        default=str(DEFAULT_INTERVAL_S),
        help="otherwise pending segments wait at most this many seconds (default: %(default)s)",
    )
    commit.add_argument(
        "--keep-snapshots",
        default=str(DEFAULT_KEEP_SNAPSHOTS),
        help="snapshots kept for time travel; older ones expire (append tables: no file deleted; default %(default)s)",
    )
    commit.set_defaults(func=cmd_table_commit)

    query = sub.add_parser("query", help="a quick SQL look (DuckDB) at the source's committed Iceberg table")
    query.add_argument("source")
    query.add_argument("sql", help="SQL over the view named after the source (- as _), and <name>_rejects")
    query.set_defaults(func=cmd_query)


TABLE_EXAMPLES = {
    "table-enable": [
        "ingest table-enable clicks",
        "ingest table-enable clicks --partition-by month --rejects none",
    ],
    "table": ["ingest table clicks", "ingest table clicks --json"],
    "table-commit": [
        "INGEST_METRICS_PORT=9410 ingest table-commit clicks",
        "ingest table-commit clicks --once",
        "ingest table-commit clicks --batch-segments 20 --interval 5",
    ],
    "query": [
        "ingest query clicks 'SELECT count(*) FROM clicks'",
        "ingest query clicks 'SELECT _error, count(*) FROM clicks_rejects GROUP BY 1'",
    ],
}
