"""``ingest migrate``, ``ingest source apply | list | history``, ``ingest check`` and
``ingest worker``: the metastore's schema, the sources' specs, what a source's workers need
(the preflight checks) and the process that runs a source."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.cli.common import emit, load_settings
from ingest.config import non_negative_seconds
from ingest.logs import configure_logging
from ingest_common.backoff import Backoff
from ingest_common.redact import redact
from metastore import Metastore, apply_migrations, redact_url

if TYPE_CHECKING:
    from ingest.cli.check import Checks

# While ``ingest migrate --wait`` waits for PostgreSQL to accept connections.
MIGRATE_RETRY = Backoff.fixed(2.0)

# The publish thread waits on PostgreSQL, the build threads on the Spark JVM; each time one
# wakes it must win the GIL back from the busy consumer thread, by default only after 5 ms.
# docs/benchmarks.md ("Earlier runs and analysis") has what that does to a publish.
GIL_SWITCH_INTERVAL_S = 0.0005


def cmd_migrate(args: argparse.Namespace) -> int:
    from metastore.errors import MetastoreUnavailable

    settings = load_settings()
    clock = MIGRATE_RETRY.clock
    deadline = clock.monotonic() + non_negative_seconds("--wait", args.wait)
    for delay in MIGRATE_RETRY.delays():
        try:
            applied = apply_migrations(settings.database_url, break_lock=args.break_lock)
            break
        except MetastoreUnavailable as exc:
            if clock.monotonic() + delay > deadline:
                raise
            print(f"ingest migrate: waiting for PostgreSQL: {redact(str(exc))}", file=sys.stderr)
            MIGRATE_RETRY.sleep(delay)
    where = redact_url(settings.database_url)
    emit(
        args,
        {"applied": applied, "database": where},
        [
            f"applied {len(applied)} migration(s) to {where}"
            + (": " + ", ".join(applied) if applied else " (already up to date)")
        ],
    )
    return 0


def _report_checks(args: argparse.Namespace, source: str, checks: Checks) -> int:
    """The checks' lines (or one --json document); their first failure's exit code."""
    code = int(checks.exit_code)
    emit(args, {"source": source, "ok": code == 0, "checks": [r.to_json() for r in checks.results]}, checks.lines())
    return code


def cmd_check(args: argparse.Namespace) -> int:
    from ingest.cli.check import run_checks
    from ingest.spec.parse import load_spec_file

    settings = load_settings(require_kafka=True)
    if args.file:
        spec, _text = load_spec_file(Path(args.file))
    else:
        from ingest.worker import load_source

        with Metastore(settings.database_url) as store:
            _version, spec = load_source(store, args.source)
    return _report_checks(args, spec.name, run_checks(settings, spec, spark=args.spark))


def cmd_source_apply(args: argparse.Namespace) -> int:
    from ingest.spec.evolution import evolution_guard
    from ingest.spec.parse import load_spec_file, resolve_registry_schema

    spec, text = load_spec_file(Path(args.file))
    # The registry's latest reader schema is fixed now and stored with this version.
    spec = resolve_registry_schema(spec)
    if args.check:
        from ingest.cli.check import run_checks

        checks = run_checks(load_settings(require_kafka=True), spec)
        if checks.exit_code:
            # Nothing stored: the spec's dependencies are fixed first.
            return _report_checks(args, spec.name, checks)
        if not args.json:
            print("\n".join(checks.lines()))
    with Metastore(load_settings().database_url) as store:
        # An Avro reader schema that earlier segments and the table could not follow is refused,
        # checked against the version it would follow in the transaction that stores it.
        version, changed = store.apply_source(
            spec.name,
            spec.to_json(),
            text,
            reactivate=getattr(args, "reactivate", False),
            follows=evolution_guard(spec),
        )
    emit(
        args,
        {"source": spec.name, "version": version, "changed": changed},
        [f"source {spec.name}: version {version}" + ("" if changed else " (unchanged)")],
    )
    return 0


def cmd_source_list(args: argparse.Namespace) -> int:
    with Metastore(load_settings().database_url) as store:
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
    emit(
        args,
        {"sources": sources},
        [f"{r['name']}\tversion {r['version']}\t{r['desired_state']}\tupdated {r['updated_at']}" for r in sources],
    )
    return 0


def cmd_source_history(args: argparse.Namespace) -> int:
    from ingest.ops.history import source_history

    with Metastore(load_settings().database_url) as store:
        versions = source_history(store, args.source)
    if args.json:
        emit(args, {"source": args.source, "versions": versions})
        return 0
    for v in versions:
        print(f"version {v['version']}\t{v['applied_at']}\t" + "; ".join(v["changes"]))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from ingest.worker import Worker

    settings = load_settings(require_kafka=True)
    configure_logging(settings.log_format)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    Worker(settings, args.source).run(stop)
    return 0
