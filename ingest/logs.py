"""structlog set-up: one JSON event per line (console renderer on a TTY or by flag)."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import traceback
from types import TracebackType
from typing import TextIO, cast

import structlog

from ingest_common import redact


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was configured (a
    test's captured stream is closed after it; the process's stream outlives every logger)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _Stderr()


def configure_logging(fmt: str = "auto", level: int = logging.INFO) -> None:
    renderer: structlog.typing.Processor
    if fmt == "console" or (fmt == "auto" and sys.stderr.isatty()):
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            # Last before rendering, so that tracebacks are covered too.
            redact.structlog_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # PrintLogger only writes and flushes: the proxy is all of a TextIO it uses.
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _STDERR)),
        # Not cached: a cached module logger keeps the configuration of its first use for the
        # process's life, so a later configure (a one-shot command, a test's capture) would
        # never reach it. The worker logs per split, not per record: the lookup costs nothing.
        cache_logger_on_first_use=False,
    )
    # Libraries that use the standard logging module (py4j, yoyo) stay quiet below WARNING.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


class _LibrdkafkaHandler(logging.Handler):
    """librdkafka's own log lines (confluent-kafka hands them to a ``logging.Logger`` as
    ``"%s [%s] %s" % (facility, client, message)``) as structured events, so JSON logs stay JSON."""

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) and len(record.args) == 3 else None
        facility, client, message = args if args is not None else ("", "", record.getMessage())
        structlog.get_logger("librdkafka").log(
            record.levelno, "librdkafka", facility=str(facility), client=str(client), message=str(message)
        )


def librdkafka_logger() -> logging.Logger:
    """The logger every Kafka client is given (``ingest.config.kafka_client``)."""
    logger = logging.getLogger("ingest.librdkafka")
    if not any(isinstance(h, _LibrdkafkaHandler) for h in logger.handlers):
        logger.addHandler(_LibrdkafkaHandler())
        logger.propagate = False
        logger.setLevel(logging.DEBUG)  # librdkafka filters by its own `log_level` / `debug`
    return logger


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact.redact(super().format(record))


def install_excepthooks() -> None:
    """Tracebacks of unexpected errors (a bug, in the main thread or any other) are printed
    as Python would, with secrets redacted: a library's message may quote a connection string."""

    def main_hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        print(redact.redact("".join(traceback.format_exception(kind, exc, tb))), end="", file=sys.stderr)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        print(f"Exception in thread {name}:", file=sys.stderr)
        main_hook(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


# ``kill -USR1 PID``: what every thread of a command is doing, as jstack shows a JVM's.
STACK_DUMP_SIGNAL = signal.SIGUSR1


def install_stack_dumps() -> None:
    """Every thread's stack to stderr on STACK_DUMP_SIGNAL, the process going on: where a
    process that does not stop or make progress is stuck. Frames only (files, lines,
    functions), never a value, so nothing a secret could be in."""
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
