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
    "PublishFailed",
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


class PublishFailed(IngestError):
    """A split was not published, as far as the worker can tell. ``cause``: SplitKilled,
    PublishConflict or any other error.

    ``unanswered``: a publish statement of the split went unanswered (the connection broke
    with the statement on the server). Its server session may have committed, or may still
    commit after the worker looked the split up, so the split's files are not the worker's to
    delete: ``ingest gc`` decides by the metastore's split registry. False only when every
    statement sent for the split was answered (refused, or failed and so rolled back)."""

    def __init__(self, cause: Exception, *, unanswered: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.unanswered = unanswered


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


class SparkDriverExited(WorkerFailed):
    """The Spark driver JVM this process launched (a local or standalone driver) exited: no
    build can run in this process again, so the role exits and its supervisor restarts it
    (ingest.spark.session.FixedSession). Nothing was published by the builds it failed."""

    def __init__(self, exit_status: int, cause: BaseException) -> None:
        super().__init__(
            f"the Spark driver JVM exited (status {exit_status}): {type(cause).__name__}: {first_line(cause)}; "
            "exiting so that the supervisor restarts this process"
        )
        self.exit_status = exit_status


class SparkUnavailable(IngestError):
    """The worker could not start its Spark session (no Java, the JVM died while starting,
    an unreachable Spark Connect server or cluster)."""

    def __init__(self, master: str, cause: BaseException) -> None:
        detail = f": {first_line(cause)}" if str(cause).strip() else ""
        super().__init__(f"could not start Spark (INGEST_SPARK_MASTER={master}): {type(cause).__name__}{detail}")


class ResetNotConfirmed(IngestError):
    """``ingest reset`` would skip or replay records and ``--yes`` was not given: nothing changed."""

    exit_code = ExitCode.NOT_CONFIRMED
