"""The ``ingest`` command line. Expected failures print one line and exit non-zero."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from ingest import __version__
from ingest.config import Settings, non_negative_seconds, positive_int
from ingest.errors import ConfigError, ExitCode, IngestError
from ingest.logs import configure_logging, install_excepthooks
from ingest.status_text import dash
from ingest_common.model import DesiredState, PartitionReset, TopicPartition, WorkerState
from ingest_common.redact import redact, register_secrets
from metastore import Metastore, apply_migrations, redact_url

# The publish thread waits on PostgreSQL, the build threads on the Spark JVM; each time one
# wakes it must win the GIL back from the busy consumer thread, by default only after 5 ms.
# `python -m bench.publish` shows what that does to a publish.
GIL_SWITCH_INTERVAL_S = 0.0005


# Every --json document carries it; it changes only when a field changes meaning or goes away.
JSON_SCHEMA_VERSION = 1


def _emit(args: argparse.Namespace, document: dict[str, Any], lines: Sequence[str] = ()) -> None:
    """The command's result: ``document`` as JSON under ``--json``, else the text ``lines``."""
    if getattr(args, "json", False):
        print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **document}, indent=2, default=str))
    else:
        for line in lines:
            print(line)


def _settings(require_kafka: bool = False) -> Settings:
    settings = Settings.from_env(require_kafka=require_kafka)
    register_secrets(settings.secret_values())
    return settings


def cmd_migrate(args: argparse.Namespace) -> int:
    from metastore.errors import MetastoreUnavailable

    settings = _settings()
    deadline = time.monotonic() + non_negative_seconds("--wait", args.wait)
    while True:
        try:
            applied = apply_migrations(settings.database_url, break_lock=args.break_lock)
            break
        except MetastoreUnavailable as exc:
            if time.monotonic() + 2 > deadline:
                raise
            print(f"ingest migrate: waiting for PostgreSQL: {redact(str(exc))}", file=sys.stderr)
            time.sleep(2)
    where = redact_url(settings.database_url)
    _emit(
        args,
        {"applied": applied, "database": where},
        [
            f"applied {len(applied)} migration(s) to {where}"
            + (": " + ", ".join(applied) if applied else " (already up to date)")
        ],
    )
    return 0


def cmd_source_apply(args: argparse.Namespace) -> int:
    from ingest.spec import load_spec_file

    spec, text = load_spec_file(Path(args.file))
    with Metastore(_settings().database_url) as store:
        version, changed = store.apply_source(
            spec.name, spec.to_json(), text, reactivate=getattr(args, "reactivate", False)
        )
    _emit(
        args,
        {"source": spec.name, "version": version, "changed": changed},
        [f"source {spec.name}: version {version}" + ("" if changed else " (unchanged)")],
    )
    return 0


def cmd_source_list(args: argparse.Namespace) -> int:
    with Metastore(_settings().database_url) as store:
        rows = store.list_sources()
    sources = [
        {
            "name": r["name"],
            "version": r["version"],
            "desired_state": r["desired_state"],
            "updated_at": r["updated_at"].isoformat(),
        }
        for r in rows
    ]
    _emit(
        args,
        {"sources": sources},
        [f"{r['name']}\tversion {r['version']}\t{r['desired_state']}\tupdated {r['updated_at']}" for r in sources],
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from ingest.worker import Worker

    settings = _settings(require_kafka=True)
    configure_logging(settings.log_format)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    Worker(settings, args.source).run(stop)
    return 0


def _since(value: str) -> datetime:
    """``--since``: an ISO 8601 time (UTC unless it says otherwise) or an age such as 30m, 2h."""
    from ingest.spec import parse_duration

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
    from ingest.status import source_segments

    since = _since(args.since) if args.since else None
    limit = positive_int("--limit", args.limit, maximum=10**9) if args.limit is not None else None
    with Metastore(_settings().database_url) as store:
        segments = source_segments(store, args.source, since, limit)
    if args.json:
        _emit(args, {"source": args.source, "segments": segments})
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
    from ingest.status import source_status
    from ingest.status_text import render as render_status

    settings = _settings()
    with Metastore(settings.database_url) as store:
        status = source_status(store, settings, args.source)
    _emit(args, status, render_status(status))
    return 0


def cmd_gaps_list(args: argparse.Namespace) -> int:
    from ingest.status import source_gaps
    from ingest.status_text import gap_line

    with Metastore(_settings().database_url) as store:
        gaps = source_gaps(store, args.source)
    if args.json:
        _emit(args, {"source": args.source, "gaps": gaps})
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
    with Metastore(_settings().database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        acked = store.acknowledge_gaps(args.source, by, None if args.all else args.id)
    _emit(
        args,
        {"source": args.source, "acknowledged": list(acked), "by": by},
        [
            f"acknowledged {len(acked)} gap(s) of {args.source} as {by}"
            + (f": {', '.join(map(str, acked))}" if acked else "")
        ],
    )
    return 0


# How often drain and terminate say what they are still waiting for.
PROGRESS_EVERY_S = 5.0


def _timeout(args: argparse.Namespace) -> float:
    """``--timeout``: a positive, finite number of seconds (0, -5 or nan would never or always time out)."""
    seconds = non_negative_seconds("--timeout", args.timeout)
    if seconds == 0:
        raise ConfigError(f"--timeout: expected a positive number of seconds, got {args.timeout!r}")
    return seconds


def _wait_drained(store: Metastore, source: str, timeout_s: float, what: DesiredState, progress: TextIO) -> list[str]:
    """Wait until every live worker of ``source`` reports drained, saying every few seconds
    which are not; returns those still not drained at the timeout (empty: all drained)."""
    deadline = time.monotonic() + timeout_s
    next_progress = time.monotonic() + PROGRESS_EVERY_S
    while True:
        pending = [
            f"{w['worker']} ({w['state']})" for w in store.live_workers(source) if w["state"] != WorkerState.DRAINED
        ]
        now = time.monotonic()
        if not pending or now >= deadline:
            return pending
        if now >= next_progress:
            print(
                f"source {source}: {what}: waiting for {len(pending)} worker(s): {', '.join(pending)} "
                f"({deadline - now:.0f} s left)",
                file=progress,
                flush=True,
            )
            next_progress = now + PROGRESS_EVERY_S
        time.sleep(0.5)


def _progress(args: argparse.Namespace) -> TextIO:
    """Where lines written while waiting go: stdout, or stderr under --json (stdout is the document)."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def cmd_control(args: argparse.Namespace) -> int:
    """suspend / resume / drain: set the source's desired state; workers act within seconds."""
    state = {"suspend": DesiredState.SUSPENDED, "resume": DesiredState.RUNNING, "drain": DesiredState.DRAINING}[
        args.command
    ]
    timeout_s = _timeout(args) if args.command == "drain" else 0.0
    settings = _settings()
    with Metastore(settings.database_url) as store:
        store.set_control(args.source, state, stay=getattr(args, "stay", False))
        print(f"source {args.source}: desired state {state}", file=_progress(args), flush=True)
        if args.command != "drain":
            _emit(args, {"source": args.source, "desired_state": state})
            return 0
        pending = _wait_drained(store, args.source, timeout_s, DesiredState.DRAINING, _progress(args))
    _emit(
        args,
        {"source": args.source, "desired_state": state, "drained": not pending, "pending": pending},
        [] if pending else [f"source {args.source}: drained (every fetched record published)"],
    )
    if pending:
        print(
            f"ingest: error: drain of {args.source} timed out after {timeout_s:g} s; still draining: "
            + ", ".join(pending),
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the source is healthy, 1 when not (for probes and scripts)."""
    from ingest.status import source_status

    settings = _settings()
    with Metastore(settings.database_url) as store:
        status = source_status(store, settings, args.source, errors=0)
    healthy = status["state"] != "UNHEALTHY"
    _emit(
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


def cmd_gc(args: argparse.Namespace) -> int:
    from ingest.gc import MIN_GRACE_S, collect_garbage

    grace = non_negative_seconds("--grace", args.grace)
    if grace < MIN_GRACE_S and not (args.force or args.dry_run):
        raise ConfigError(
            f"--grace {grace:g} is below {MIN_GRACE_S:g} s: splits that running workers are still "
            "building or publishing would be abandoned and read again; add --force if the source's "
            "workers are stopped or that is intended (or look with --dry-run)"
        )
    with Metastore(_settings().database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        result = collect_garbage(store, args.source, grace_s=grace, dry_run=args.dry_run)
    would = "would " if args.dry_run else ""
    _emit(
        args,
        {
            "source": args.source,
            "dry_run": args.dry_run,
            "grace_s": grace,
            "abandoned": result.abandoned,
            "deleted": list(result.deleted),
            "swept": result.swept,
            "kept": result.kept,
            "unswept": result.unswept,
            "unsafe": list(result.unsafe),
        },
        [
            f"{would}abandon{'' if would else 'ed'} {result.abandoned} split(s) older than the grace period; "
            f"{would}delete{'' if would else 'd'} {len(result.deleted)} file(s) of {result.swept} build(s); "
            f"kept {result.kept} published file(s); {result.unswept} build(s) wait for splits still building"
        ],
    )
    for problem in result.unsafe:
        print(f"gc: not swept, {problem}", file=sys.stderr)
    return 1 if result.unsafe else 0


def cmd_source_history(args: argparse.Namespace) -> int:
    from ingest.history import source_history

    with Metastore(_settings().database_url) as store:
        versions = source_history(store, args.source)
    if args.json:
        _emit(args, {"source": args.source, "versions": versions})
        return 0
    for v in versions:
        print(f"version {v['version']}\t{v['applied_at']}\t" + "; ".join(v["changes"]))
    return 0


def _reset_targets(
    to: str, rows: list[dict[str, Any]], settings: Settings
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """``--to`` as offsets per partition, and Kafka's low watermarks where known."""
    from ingest.config import is_digits
    from ingest.errors import ConfigError, KafkaUnavailable
    from ingest.status import watermarks

    tps = [TopicPartition(r["topic"], r["partition"]) for r in rows]
    if not tps:
        raise ConfigError("the source has no partitions yet (a worker registers them when it starts)")
    logical = to in ("earliest", "latest")
    # Never-published partitions would start from Kafka's earliest: the plan needs it to say what is skipped.
    asked = tps if logical else [TopicPartition(r["topic"], r["partition"]) for r in rows if r["next_offset"] is None]
    marks = watermarks(settings, [(tp.topic, tp.partition) for tp in asked])
    earliest = {tp: marks[(tp.topic, tp.partition)][0] for tp in asked if (tp.topic, tp.partition) in marks}
    if logical:
        if len(marks) != len(tps):
            raise KafkaUnavailable(
                f"--to {to} needs Kafka's watermarks, but Kafka at {settings.kafka_bootstrap!r} "
                "did not answer; give explicit offsets (TOPIC:PARTITION=OFFSET)"
            )
        return {tp: marks[(tp.topic, tp.partition)][0 if to == "earliest" else 1] for tp in tps}, earliest
    topics = sorted({tp.topic for tp in tps})
    targets: dict[TopicPartition, int] = {}
    for item in to.split(","):
        where, sep, offset = item.strip().rpartition("=")
        topic, colon, partition = where.rpartition(":")
        if not colon and len(topics) == 1:
            topic = topics[0]
        if not sep or not topic or not is_digits(partition) or not is_digits(offset):
            raise ConfigError(f"--to: expected earliest, latest or TOPIC:PARTITION=OFFSET,... got {item!r}")
        targets[TopicPartition(topic, int(partition))] = int(offset)
    return targets, earliest


def cmd_reset(args: argparse.Namespace) -> int:
    """Set stored offsets (audited); workers drop what they hold for those partitions and re-seek."""
    import getpass
    import socket

    from ingest.errors import ResetNotConfirmed

    settings = _settings()
    with Metastore(settings.database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        targets, earliest = _reset_targets(args.to, store.partitions(args.source), settings)
        actor = f"{getpass.getuser()}@{socket.gethostname()}"
        result = store.reset_offsets(
            args.source, targets, actor=actor, reason=args.reason, target=args.to, confirmed=args.yes, earliest=earliest
        )
    if not result.partitions:
        _emit(
            args,
            {"source": args.source, "reset_id": None, "partitions": []},
            [f"source {args.source}: nothing to reset (stored offsets already there)"],
        )
        return 0
    if result.reset_id is None:
        effects = "; ".join(f"{p.tp} {_reset_effect(p)}" for p in result.partitions if p.replayed or p.skipped)
        raise ResetNotConfirmed(
            f"reset of {args.source} would change what is published ({effects}); "
            "nothing changed: re-run with --yes to apply"
        )
    lines = [f"source {args.source}: reset #{result.reset_id} by {actor}"]
    lines += [
        f"  {p.tp}: {dash(p.old_offset)} -> {p.new_offset} (serial {p.old_serial} -> {p.new_serial})"
        + (f", {_reset_effect(p)}" if _reset_effect(p) else "")
        for p in result.partitions
    ]
    partitions = [
        {
            "topic": p.tp.topic,
            "partition": p.tp.partition,
            "old_offset": p.old_offset,
            "new_offset": p.new_offset,
            "old_serial": p.old_serial,
            "new_serial": p.new_serial,
            "replayed": p.replayed,
            "skipped": p.skipped,
        }
        for p in result.partitions
    ]
    _emit(args, {"source": args.source, "reset_id": result.reset_id, "actor": actor, "partitions": partitions}, lines)
    return 0


def _reset_effect(p: PartitionReset) -> str:
    if p.replayed:
        return f"replays [{p.replayed[0]}, {p.replayed[1]})"
    if p.skipped:
        return f"skips [{p.skipped[0]}, {p.skipped[1]})"
    return ""


def cmd_terminate(args: argparse.Namespace) -> int:
    """Drain every worker (they publish what they hold and exit), then mark the source terminated."""
    timeout_s = _timeout(args)
    with Metastore(_settings().database_url) as store:
        if store.control(args.source).terminated:
            _emit(
                args,
                {"source": args.source, "state": "terminated", "already": True},
                [f"source {args.source}: already terminated"],
            )
            return 0
        store.set_control(args.source, DesiredState.TERMINATING)
        print(
            f"source {args.source}: terminating (workers publish what they hold and exit)",
            file=_progress(args),
            flush=True,
        )
        pending = _wait_drained(store, args.source, timeout_s, DesiredState.TERMINATING, _progress(args))
        if pending:
            _emit(args, {"source": args.source, "state": "terminating", "pending": pending})
            print(
                f"ingest: error: terminate of {args.source} timed out after {timeout_s:g} s; still draining: "
                + ", ".join(pending)
                + " (the source stays terminating; re-run to wait again)",
                file=sys.stderr,
            )
            return 1
        if not store.mark_terminated(args.source):
            # Another terminate finished first (fine), or the state was changed under us (by a
            # release that let other controls override terminating): never claim what is not so.
            state = store.control(args.source).desired_state
            if state is not DesiredState.TERMINATED:
                _emit(args, {"source": args.source, "state": state, "pending": []})
                print(
                    f"ingest: error: source {args.source} was not terminated: its state changed to {state} "
                    "while its workers drained",
                    file=sys.stderr,
                )
                return 1
    _emit(
        args,
        {"source": args.source, "state": "terminated", "already": False},
        [f"source {args.source}: terminated (segments, status and history stay queryable)"],
    )
    return 0


# -- Iceberg tables (ingest/table/, issue 20) -------------------------------------------------


def cmd_table_enable(args: argparse.Namespace) -> int:
    from ingest.table.config import PartitionBy, RejectsMode
    from ingest.table.enable import enable_table

    partition_by = None if args.partition_by is None else PartitionBy(args.partition_by)
    done = enable_table(_settings().database_url, args.source, partition_by, RejectsMode(args.rejects))
    _emit(
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

    status = table_status(_settings().database_url, args.source)
    _emit(args, status, render(status))
    return 0


def cmd_table_commit(args: argparse.Namespace) -> int:
    from ingest.endpoints import Endpoints
    from ingest.table.committer import TableCommitter
    from ingest.table.config import CommitSettings

    settings = _settings()
    commit_settings = CommitSettings(
        batch_segments=positive_int("--batch-segments", args.batch_segments, maximum=1000),
        interval_s=non_negative_seconds("--interval", args.interval),
        keep_snapshots=positive_int("--keep-snapshots", args.keep_snapshots, maximum=100_000),
    )
    with TableCommitter(settings.database_url, args.source, commit_settings) as committer:
        if args.once:
            results = committer.commit_all()
            _emit(
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
                },
                [
                    f"{r.kind.value} commit {r.seq}: segments {r.segment_ids[0]}..{r.segment_ids[-1]} "
                    f"({len(r.segment_ids)}), {r.files} file(s), {r.seconds * 1000:.0f} ms"
                    for r in results
                ]
                or [f"source {args.source}: nothing to commit"],
            )
            return 0
        configure_logging(settings.log_format)
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
            committer.run(stop)
        finally:
            if endpoints is not None:
                endpoints.close()
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from ingest.table.status import format_rows, run_query

    columns, rows = run_query(_settings().database_url, args.source, args.sql)
    _emit(
        args,
        {"source": args.source, "columns": columns, "rows": [list(r) for r in rows]},
        format_rows(columns, rows),
    )
    return 0


def _add_table_commands(sub: Any) -> None:
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
        "spec must cut files by it or a finer transform, see the README)",
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
        help="snapshots kept for time travel; older ones are expired, no file deleted (default: %(default)s)",
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


# `ingest COMMAND --help` ends with these.
EXAMPLES = {
    "migrate": [
        "ingest migrate",
        "ingest migrate --wait 120      # PostgreSQL may still be starting",
        "ingest migrate --break-lock    # a migrate died holding the lock; none runs now",
    ],
    "source apply": [
        "ingest source apply deploy/clicks.toml",
        "ingest source apply deploy/clicks.toml --reactivate   # run a terminated source again",
    ],
    "source list": ["ingest source list"],
    "source history": ["ingest source history clicks", "ingest source history clicks --json"],
    "worker": ["INGEST_METRICS_PORT=9400 ingest worker clicks"],
    "status": ["ingest status clicks", "ingest status clicks --json | jq .partitions"],
    "segments": [
        "ingest segments clicks --since 1h",
        "ingest segments clicks --limit 10 --json",
        "ingest segments clicks --since 2026-11-25T04:00:00Z",
    ],
    "health": ["ingest health clicks || echo unhealthy"],
    "suspend": ["ingest suspend clicks"],
    "resume": ["ingest resume clicks"],
    "drain": ["ingest drain clicks --timeout 120   # before an upgrade", "ingest drain clicks --stay"],
    "reset": [
        "ingest reset clicks --to latest --reason 'skip the backlog' --yes",
        "ingest reset clicks --to clicks:0=1200,clicks:1=0 --yes",
    ],
    "terminate": ["ingest terminate clicks --timeout 600"],
    "gaps list": ["ingest gaps list clicks"],
    "gaps ack": ["ingest gaps ack clicks --id 3 --by alice", "ingest gaps ack clicks --all"],
    "gc": [
        "ingest gc clicks --dry-run",
        "ingest gc clicks                 # grace: 6 h",
        "ingest gc clicks --grace 0 --force   # only when no worker of the source runs",
    ],
    **TABLE_EXAMPLES,
}


def _finish(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Every command but ``worker`` (which logs) takes --json; every command's help ends with examples."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands:
        for name, sub in action.choices.items():
            _finish(sub, f"{path} {name}".strip())
    if not path or subcommands:
        return
    if path != "worker" and "--json" not in parser._option_string_actions:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[path])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    from ingest.gc import DEFAULT_GRACE_S

    parser = argparse.ArgumentParser(prog="ingest", description="Exactly-once Kafka ingestion workers")
    parser.add_argument("--version", action="version", version=f"ingest {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    migrate = sub.add_parser("migrate", help="create or upgrade the metastore schema")
    # Parsed by cmd_migrate: a bad value is a one-line ConfigError naming --wait.
    migrate.add_argument(
        "--wait", default="0", help="retry connecting to PostgreSQL for up to this many seconds (default: %(default)s)"
    )
    migrate.add_argument(
        "--break-lock",
        action="store_true",
        help="remove a migration lock left by a run that died (only when no other migrate runs)",
    )
    migrate.set_defaults(func=cmd_migrate)

    source = sub.add_parser("source", help="manage source specs").add_subparsers(dest="source_command", required=True)
    apply = source.add_parser("apply", help="validate and store a TOML source spec (a new version if it changed)")
    apply.add_argument("file")
    apply.set_defaults(func=cmd_source_apply)
    source.add_parser("list", help="list sources").set_defaults(func=cmd_source_list)
    apply.add_argument("--reactivate", action="store_true", help="run a terminated source again")
    history = source.add_parser("history", help="every applied version of a source's spec and what changed")
    history.add_argument("source")
    history.set_defaults(func=cmd_source_history)

    reset = sub.add_parser("reset", help="set stored offsets (audited); workers re-seek")
    reset.add_argument("source")
    reset.add_argument(
        "--to",
        required=True,
        help="earliest, latest or TOPIC:PARTITION=OFFSET,... (PARTITION=OFFSET for a one-topic source)",
    )
    reset.add_argument("--reason", default="", help="why (stored in the audit table)")
    reset.add_argument("--yes", action="store_true", help="confirm a reset that skips or replays records")
    reset.set_defaults(func=cmd_reset)

    terminate = sub.add_parser("terminate", help="drain every worker, then mark the source terminated")
    terminate.add_argument("source")
    terminate.add_argument("--timeout", default="300", help="seconds to wait (default %(default)s)")
    terminate.set_defaults(func=cmd_terminate)

    worker = sub.add_parser("worker", help="run a worker until SIGTERM/SIGINT")
    worker.add_argument("source")
    worker.set_defaults(func=cmd_worker)

    for name, func, help_text in (
        ("segments", cmd_segments, "list published segments"),
        ("status", cmd_status, "per-partition offsets, lag and owners"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("source")
        if name == "segments":
            p.add_argument(
                "--since",
                help="only segments published since this time (ISO 8601, UTC by default) or this long ago (30m, 2h)",
            )
            p.add_argument("--limit", help="only the newest N segments")
        p.set_defaults(func=func)

    for name, help_text in (
        ("suspend", "workers publish what they hold, then pause (staying in the group)"),
        ("resume", "workers consume again from the stored offsets (also ends a drain)"),
        ("drain", "workers publish everything held, report drained and exit (for upgrades)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("source")
        if name == "drain":
            p.add_argument("--stay", action="store_true", help="keep drained workers running, idle")
            p.add_argument("--timeout", default="300", help="seconds to wait (default %(default)s)")
        p.set_defaults(func=cmd_control)

    gaps = sub.add_parser("gaps", help="the gap ledger: offsets no longer in the log when they were needed")
    gaps_sub = gaps.add_subparsers(dest="gaps_command", required=True)
    gaps_list = gaps_sub.add_parser("list", help="every recorded gap of a source")
    gaps_list.add_argument("source")
    gaps_list.set_defaults(func=cmd_gaps_list)
    gaps_ack = gaps_sub.add_parser("ack", help="acknowledge gaps (they stay in the ledger)")
    gaps_ack.add_argument("source")
    gaps_ack.add_argument("--id", type=int, action="append", help="a gap id (repeatable)")
    gaps_ack.add_argument("--all", action="store_true", help="every unacknowledged gap of the source")
    gaps_ack.add_argument("--by", help="who acknowledges (default: the OS user)")
    gaps_ack.set_defaults(func=cmd_gaps_ack)

    health = sub.add_parser("health", help="exit 0 if the source is healthy, 1 if not")
    health.add_argument("source")
    health.set_defaults(func=cmd_health)

    gc = sub.add_parser("gc", help="delete segment files that no published segment points to")
    gc.add_argument("source")
    # Parsed by cmd_gc, as the settings are: a bad value is a one-line ConfigError naming --grace.
    gc.add_argument(
        "--grace",
        default=str(DEFAULT_GRACE_S),
        help="only delete unpublished files older than this many seconds (default: %(default)s)",
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would be abandoned and deleted; change nothing")
    gc.add_argument(
        "--force",
        action="store_true",
        help="allow a grace below 1 h: only when none of the source's workers is running",
    )
    gc.set_defaults(func=cmd_gc)
    _add_table_commands(sub)
    _finish(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_excepthooks()
    try:
        return int(args.func(args))
    except IngestError as exc:
        print(f"ingest: error: {redact(str(exc))}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


def exit_process(code: int) -> None:
    """Exit with ``code``. A Spark start given up on (ingest.spark.create_session_within)
    cannot be stopped, and the Spark Connect client's exit hook would retry its server for
    minutes: then the process ends at once, its output flushed."""
    from ingest.spark import start_abandoned

    if start_abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def run() -> None:
    """The ``ingest`` console script."""
    exit_process(main())


if __name__ == "__main__":
    run()
