"""The worker's errors, under the project's one root (:mod:`ingest_common.errors`, which also
holds the exit-code table). Re-exported here: the root, ConfigError and the line helpers."""

from __future__ import annotations

from ingest_common.errors import ConfigError, ExitCode, IngestError, first_line, shown

__all__ = [
    "BuildError",
    "ConfigError",
    "ExitCode",
    "IngestError",
    "KafkaUnavailable",
    "ParseFailure",
    "PublishAbandoned",
    "ResetNotConfirmed",
    "SparkUnavailable",
    "SplitKilled",
    "TopicNotFound",
    "WorkerFailed",
    "first_line",
    "shown",
]


class KafkaUnavailable(IngestError):
    exit_code = ExitCode.KAFKA_UNAVAILABLE


class TopicNotFound(IngestError):
    exit_code = ExitCode.TOPIC_NOT_FOUND


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

    exit_code = ExitCode.PARSE_FAILURE

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

    exit_code = ExitCode.NOT_CONFIRMED
