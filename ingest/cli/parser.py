"""The command line's shape: every command, its flags, and the examples its ``--help`` ends
with."""

from __future__ import annotations

import argparse

from ingest import __version__
from ingest.cli.actions import cmd_control, cmd_gc, cmd_reset, cmd_terminate
from ingest.cli.compact import EXAMPLES as COMPACT_EXAMPLES
from ingest.cli.compact import add_compact_command
from ingest.cli.observe import cmd_audit, cmd_gaps_ack, cmd_gaps_list, cmd_health, cmd_segments, cmd_status
from ingest.cli.sources import (
    cmd_check,
    cmd_migrate,
    cmd_source_apply,
    cmd_source_history,
    cmd_source_list,
    cmd_worker,
)
from ingest.cli.tables import TABLE_EXAMPLES, add_table_commands

# `ingest COMMAND --help` ends with these.
EXAMPLES = {
    "migrate": [
        "ingest migrate",
        "ingest migrate --wait 120      # PostgreSQL may still be starting",
        "ingest migrate --break-lock    # a migrate died holding the lock; none runs now",
    ],
    "source apply": [
        "ingest source apply deploy/clicks.toml",
        "ingest source apply deploy/clicks.toml --check        # stored only if every check passes",
        "ingest source apply deploy/clicks.toml --reactivate   # run a terminated source again",
    ],
    "check": [
        "ingest check clicks                            # the stored spec's dependencies, as a worker sees them",
        "ingest check --file deploy/clicks.toml --spark  # a spec not applied yet; and a real build in Spark",
        "ingest check clicks --json | jq '.checks[] | select(.status != \"ok\")'",
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
    "audit": [
        "ingest audit clicks              # the metastore: every offset in one segment or one skipped gap",
        "ingest audit clicks --files      # and every listed file, its footer, the Iceberg tables",
        "ingest audit clicks --files --json | jq .findings",
    ],
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
    **COMPACT_EXAMPLES,
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
    from ingest.ops.gc import DEFAULT_GRACE_S

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
    apply.add_argument(
        "--check", action="store_true", help="run `ingest check` on the spec first; store it only if every check passes"
    )
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

    check = sub.add_parser(
        "check",
        help="preflight: the metastore, Kafka (credentials, topics, a read, the group), Spark's reader settings,"
        " the registry, the store and the catalog, as a worker of the source needs them; one line each",
    )
    which = check.add_mutually_exclusive_group(required=True)
    which.add_argument("source", nargs="?", help="a stored source")
    which.add_argument("--file", help="a spec file (not stored)")
    check.add_argument(
        "--spark", action="store_true", help="also start Spark and build a few of the newest records (then deleted)"
    )
    check.set_defaults(func=cmd_check)

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

    audit = sub.add_parser(
        "audit", help="prove every offset is in exactly one current segment or skipped gap; exit 1 on any finding"
    )
    audit.add_argument("source")
    audit.add_argument(
        "--files",
        action="store_true",
        help="also read every listed file's footer (rows, offsets) and check the Iceberg tables",
    )
    audit.set_defaults(func=cmd_audit)

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
    add_compact_command(sub)
    add_table_commands(sub)
    _finish(parser)
    return parser
