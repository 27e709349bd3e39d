"""The package's exception hierarchy.

Every expected failure is an :class:`IngestError`; the CLI turns it into one
clear line and a non-zero exit code. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class IngestError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 1


class ConfigError(IngestError):
    """A setting or a source spec is invalid. The message names the field."""

    exit_code = 2


class SourceNotFound(IngestError):
    exit_code = 3


class KafkaUnavailable(IngestError):
    exit_code = 4


class TopicNotFound(IngestError):
    exit_code = 5


class SplitKilled(IngestError):
    """The split's kill switch was tripped: it must neither be built further nor published."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"split killed: {reason}")
        self.reason = reason


class PublishAbandoned(SplitKilled):
    """Killed while a commit's outcome was unknown: the segment may have been published,
    so its files must be left for ``ingest gc`` (which asks the metastore) to judge."""


class BuildError(IngestError):
    """Spark (or the segment store) failed to build a segment; the split may be retried."""


class ParseFailure(IngestError):
    """A record failed to parse under ``on_parse_error = "fail"``: the worker stops."""

    exit_code = 6

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(
            f"unparseable record at topic={topic} partition={partition} offset={offset}: {reason}"
            ' (on_parse_error = "fail"; nothing at or after this offset was published)'
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason


class WorkerFailed(IngestError):
    """The worker stopped because of an unrecoverable condition."""


class SparkUnavailable(IngestError):
    """The worker could not start its Spark session (no Java, the JVM died while starting,
    an unreachable Spark Connect server or cluster)."""

    def __init__(self, master: str, cause: BaseException) -> None:
        detail = f": {first_line(cause)}" if str(cause).strip() else ""
        super().__init__(f"could not start Spark (INGEST_SPARK_MASTER={master}): {type(cause).__name__}{detail}")


class ResetNotConfirmed(IngestError):
    """``ingest reset`` would skip or replay records and ``--yes`` was not given: nothing changed."""

    exit_code = 10


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Java stack traces and Py4J errors run to
    hundreds of lines), capped, or its type name when it has no message."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def shown(value: object, limit: int = 40) -> str:
    """A value for an error line: its repr, cut short (a 400-digit number is one line, not ten)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
