"""The root of the project's exception hierarchy and its one exit-code table.

Every error raised on purpose, by the worker or the metastore, is an :class:`IngestError`;
the CLI turns it into one clear line and exits with its class's :class:`ExitCode`. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """What the ``ingest`` command's exit status means (docs/cli.md's table is checked against it)."""

    OK = 0
    # A worker stopped on an unrecoverable condition, a check found the source unhealthy, a
    # wait timed out, gc refused an unsafe path, the migration lock is held.
    FAILED = 1
    # A setting, an option, a spec or a request the metastore refuses as it stands
    # (argparse's usage errors exit with 2 as well).
    INVALID_INPUT = 2
    UNKNOWN_SOURCE = 3
    KAFKA_UNAVAILABLE = 4
    TOPIC_NOT_FOUND = 5
    PARSE_FAILURE = 6
    METASTORE_UNAVAILABLE = 7
    SCHEMA_NOT_CURRENT = 8
    SOURCE_TERMINATED = 9
    NOT_CONFIRMED = 10
    # The Iceberg catalog a spec's [table] names does not answer, or refuses the credentials.
    CATALOG_UNAVAILABLE = 11
    INTERRUPTED = 130


class IngestError(Exception):
    """Base class of every error this project raises on purpose."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class ConfigError(IngestError):
    """A setting or a source spec is invalid. The message names the field."""

    exit_code = ExitCode.INVALID_INPUT


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Java stack traces and Py4J errors run to
    hundreds of lines), capped, or its type name when it has no message. A gRPC error (the
    Spark Connect client lets some through) is its status and details: its text is a
    multi-line repr whose first line says nothing."""
    if type(exc).__module__.startswith("grpc") and callable(getattr(exc, "details", None)):
        code = exc.code() if callable(getattr(exc, "code", None)) else None  # type: ignore[attr-defined]
        return f"{getattr(code, 'name', 'gRPC')}: {exc.details()}"[:300]  # type: ignore[attr-defined]
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


_GENERIC = ("An error occurred while calling", "py4j.protocol", "Traceback")


def cause_line(exc: BaseException) -> str:
    """The line of an error that says what went wrong: for a Spark failure (a Py4J error, or a
    Spark Connect one) its root cause (the last ``Caused by:``, else the first exception line
    after Py4J's "An error occurred while calling oNNN.parquet."), otherwise :func:`first_line`."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return first_line(exc)
    caused = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    if caused:
        return caused[-1][:300]
    for line in lines:
        body = line.removeprefix(": ")
        if body.startswith(_GENERIC) or line.startswith("at "):
            continue
        if "Exception" in body or "Error" in body:
            return body[:300]
    return first_line(exc)


def shown(value: object, limit: int = 40) -> str:
    """A value for an error line: its repr, cut short (a 400-digit number is one line, not ten)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_unknown_fields(section: str, doc: Mapping[str, object], allowed: Iterable[str]) -> None:
    """One line naming the fields of ``doc`` that ``allowed`` does not, and what is allowed
    (``section``: the TOML table they were found in, empty at the top level)."""
    known = set(allowed)
    if unknown := set(doc) - known:
        where = f"{section}: " if section else ""
        raise ConfigError(f"{where}unknown field(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(known))}")
