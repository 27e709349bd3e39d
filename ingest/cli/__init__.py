"""The ``ingest`` command line (``ingest.cli:run``, and ``python -m ingest``).

Expected failures print one line and exit non-zero: every command raises an ``IngestError``
subclass, and :func:`main` turns it into ``ingest: error: <redacted message>`` and the exit
code its class names (the table in ingest_common.errors). Every command but ``worker`` takes
``--json`` (one document on stdout, ``schema_version`` included); every ``--help`` ends with
examples.

    parser   every command, its flags and examples (``build_parser``)
    common   the settings from the environment, and a command's result (``--json`` or text)
    sources  migrate, source apply / list / history, check, worker
    observe  status, health, segments, gaps list / ack, audit
    actions  suspend, resume, drain, reset, terminate, gc
    tables   table-enable, table, table-commit, query (the Iceberg tables)
    check    the preflight checks of ``ingest check`` (check_spark: its ``--spark`` build)

The commands import what they use when they run, so ``ingest --help`` imports neither Spark
nor pyiceberg.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ingest.cli.parser import build_parser
from ingest.errors import ExitCode, IngestError
from ingest.logs import configure_logging, install_excepthooks, install_stack_dumps
from ingest_common.redact import redact


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Every command's log events go to stderr, redacted (stdout carries --json documents
    # only); the long-running commands configure them again from their settings.
    configure_logging(os.environ.get("INGEST_LOG_FORMAT", "auto"))
    install_excepthooks()
    try:
        return int(args.func(args))
    except IngestError as exc:
        print(f"ingest: error: {redact(str(exc))}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


def exit_process(code: int) -> None:
    """Exit with ``code``. A Spark start given up on (ingest.spark.start.create_session_within)
    or a job interrupt still running (ingest.spark.session.JobInterrupts) cannot be stopped, and
    the Spark Connect client's exit hook would retry its server for
    minutes: then the process ends at once, its output flushed."""
    from ingest.spark.session import start_abandoned

    if start_abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def run() -> None:
    """The ``ingest`` console script (a process of its own: its stderr is a file)."""
    install_stack_dumps()
    exit_process(main())
