"""``ingest compact``: one compaction of a source (ingest.compact)."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import TYPE_CHECKING

from ingest.cli.common import emit, load_settings
from ingest.config import Settings, default_worker_id, non_negative_seconds
from ingest.spec.model import SourceSpec
from ingest.spec.parse import parse_size
from metastore import Metastore

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.compact.job import Compactor
    from ingest.compact.metrics import CompactionMetrics
    from ingest.spark.session import SessionSource

EXAMPLES = {
    "compact": [
        "ingest compact clicks --dry-run",
        "ingest compact clicks                         # target: the spec's [compaction] target_file_size",
        "ingest compact clicks --target-size 128MiB --max-chunks 10",
        "ingest compact clicks --every 600   # the long-running role: one active per source, others stand by",
    ],
}


def add_compact_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    compact = sub.add_parser(
        "compact", help="rewrite runs of small published segments into files near a target size, exactly once"
    )
    compact.add_argument("source")
    # Parsed by cmd_compact: a bad value is a one-line ConfigError naming the option.
    compact.add_argument("--target-size", help='files near this size, like "256MiB" (default: the spec\'s)')
    compact.add_argument("--max-chunks", type=int, help="compact at most this many runs now (default: all)")
    compact.add_argument("--dry-run", action="store_true", help="say which segments would be compacted; change nothing")
    compact.add_argument(
        "--every",
        help="run until SIGTERM/SIGINT, a pass every this many seconds; one compactor per source is "
        "active (a lock), the others stand by",
    )
    compact.set_defaults(func=cmd_compact)


def compactor_sessions(settings: Settings, metrics: CompactionMetrics) -> Callable[[SourceSpec], SessionSource]:
    """The compactor's Spark session, made on its first job; under Spark Connect what the
    session goes through is counted in ``metrics`` (ingest_spark_connect_events_total), as
    for a worker."""
    from ingest.spark.start import open_session_source

    def sessions(spec: SourceSpec) -> SessionSource:
        return open_session_source(settings, "ingest-compact", [spec.segment_store], on_event=metrics.connect_event)

    return sessions


def cmd_compact(args: argparse.Namespace) -> int:
    from ingest.compact.job import Compactor
    from ingest.compact.metrics import CompactionMetrics

    target = parse_size("--target-size", args.target_size) if args.target_size is not None else None
    every = non_negative_seconds("--every", args.every) if args.every is not None else None
    settings = load_settings()
    metrics = CompactionMetrics(args.source)

    with Metastore(settings.database_url) as store:
        compactor = Compactor(
            store, compactor_sessions(settings, metrics), f"compact-{settings.worker_id or default_worker_id()}"
        )
        try:
            if every is not None:
                return _run_role(compactor, store, args.source, every, target, settings, metrics)
            result = compactor.run(args.source, target, args.max_chunks, dry_run=args.dry_run)
        finally:
            compactor.stop()
    would = "would " if args.dry_run else ""
    chosen = [
        {
            "topic": c.tp.topic,
            "partition": c.tp.partition,
            "start": c.start,
            "end": c.end,
            "segments": list(c.ids),
            "files": len(c.files),
            "bytes": c.size_bytes,
            "rows": c.rows,
        }
        for c in result.chosen
    ]
    replaced = [
        {
            "segment": r.segment_id,
            "replaced": list(r.replaced),
            "topic": r.tp.topic,
            "partition": r.tp.partition,
            "start": r.start,
            "end": r.end,
            "files_before": r.files_before,
            "files_after": r.files_after,
            "bytes_before": r.bytes_before,
            "bytes_after": r.bytes_after,
            "seconds": round(r.seconds, 3),
        }
        for r in result.replaced
    ]
    refused = [{"segments": list(ids), "reason": reason, "detail": detail} for ids, reason, detail in result.refused]
    segments_in = sum(len(c.ids) for c in result.chosen)
    emit(
        args,
        {
            "source": args.source,
            "dry_run": args.dry_run,
            "target_bytes": result.target_bytes,
            "chosen": chosen,
            "replaced": replaced,
            "refused": refused,
        },
        [
            f"{would}compact {segments_in} segment(s) in {len(result.chosen)} run(s) "
            f"(target {result.target_bytes} bytes per file)",
            *(
                f"  {r.tp}[{r.start}, {r.end}): segments {_ids(r.replaced)} -> segment {r.segment_id}; "
                f"files {r.files_before} -> {r.files_after}, bytes {r.bytes_before} -> {r.bytes_after}"
                for r in result.replaced
            ),
            *(f"  refused ({reason}) for segments {_ids(ids)}: {detail}" for ids, reason, detail in result.refused),
        ],
    )
    return 1 if result.refused else 0


def _run_role(
    compactor: Compactor,
    store: Metastore,
    source: str,
    every: float,
    target: int | None,
    settings: Settings,
    metrics: CompactionMetrics,
) -> int:
    from ingest.compact.runner import compactor_health, run_compactor
    from ingest.ops.endpoints import Endpoints

    store.latest_spec(source)  # SourceNotFound before the role starts
    stop = threading.Event()

    def _stop(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    health = compactor_health(source, every, settings.compact_pass_deadline_s)
    endpoints = None
    if settings.metrics_port is not None:
        # /metrics, /healthz and /readyz as the workers and the table committer serve them.
        endpoints = Endpoints(metrics.registry, health.healthy, health.ready)
        endpoints.serve(settings.metrics_host, settings.metrics_port)
    try:
        run_compactor(compactor, store, source, every, stop, target, metrics, health)
    finally:
        if endpoints is not None:
            endpoints.close()
    return 0


def _ids(ids: tuple[int, ...]) -> str:
    return f"{ids[0]}..{ids[-1]} ({len(ids)})" if len(ids) > 3 else ", ".join(map(str, ids))
