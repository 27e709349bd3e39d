"""Small value types shared by the loop, the pipeline, the builder and the metastore."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

StartFrom = Literal["earliest", "latest"]

# Why a record could not be parsed: the builder's `_error` values, the reason label of
# ingest_records_rejected_total / ingest_records_skipped_total. A fixed set (no label explosion).
PARSE_ERRORS = (
    "invalid_json",
    "type_mismatch",
    "invalid_utf8",
    "null_value",
    "missing_event_time",
    # An event time outside years 1-9999 (UTC), which no Python datetime holds.
    "event_time_out_of_range",
    # Any other timestamp or date of the value, at any depth, outside years 1-9999
    # (ingest.builder.value_checks; a string of an Avro value that is not UTF-8 is invalid_utf8).
    "timestamp_out_of_range",
    # Formats avro and json_schema (the Confluent wire format): no zero magic byte and 4-byte
    # schema id; an id the registry does not know; an Avro body that does not decode; a writer
    # schema that Avro's resolution rules cannot read as the reader schema (checked per id).
    "not_confluent_framed",
    "unknown_schema_id",
    "undecodable",
    "unresolvable_writer_schema",
    # Format protobuf: a message-index path the writer's file does not have; a field or value
    # the reader column cannot hold (a bytes field for a string column, an enum number the
    # writer's enum does not define, an integer past ±2^53 into double or ±2^24 into float, a
    # writer schema that cannot be read). A proto2 string that is not UTF-8 is invalid_utf8.
    "unknown_message_index",
    "unresolvable",
    # A key that does not decode with key_format (after the value's reasons): a framed key
    # without the header; an id the registry does not know; a body (or, for "string", UTF-8)
    # that does not decode. A null key is no error: its decoded columns are null.
    "key_not_confluent_framed",
    "key_unknown_schema_id",
    "key_undecodable",
    # Upsert sources ([table] mode = "upsert"; ingest.builder.changes): a record that is not a
    # tombstone without its key's columns; a tombstone (null value) whose key does not give
    # them; a Debezium event whose op is not c, u, r or d, or without the row its op names;
    # a Debezium truncate (op t), which the upsert table does not apply (docs/configuration.md).
    "null_key",
    "tombstone_without_key",
    "invalid_envelope",
    "debezium_truncate",
)


# The label values of the worker's counters. Each set is fixed (no label explosion), and every
# value is exported at 0 from the start, so that increase() sees the first one.
class KillReason(StrEnum):
    """Why the kill switch of an in-flight split was tripped (ingest_splits_killed_total)."""

    REVOKE = "revoke"
    LOST = "lost"
    OUT_OF_RANGE = "out_of_range"
    RESET = "reset"
    REWIND = "rewind"
    SHUTDOWN = "shutdown"
    # An earlier split of the partition failed or was refused: a later one can never publish.
    PREDECESSOR_FAILED = "predecessor_failed"


class ConflictReason(StrEnum):
    """Why the metastore refused a publish (ingest_publish_conflicts_total; the CHECK of
    ingest_publish_conflicts.reason in migrations/0008)."""

    SERIAL = "serial"
    OFFSET = "offset"
    MISSING = "missing"
    ABANDONED = "abandoned"
    UNREGISTERED = "unregistered"


class FailureStage(StrEnum):
    """Where a split failed (ingest_split_failures_total)."""

    BUILD = "build"
    PUBLISH = "publish"


class RebalanceKind(StrEnum):
    """Which rebalance callback ran (ingest_rebalances_total)."""

    ASSIGN = "assign"
    REVOKE = "revoke"
    LOST = "lost"


class DesiredState(StrEnum):
    """What operators asked of a source (ingest_sources.desired_state; its CHECK in the migrations)."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    DRAINING = "draining"
    TERMINATING = "terminating"
    TERMINATED = "terminated"

    @property
    def holding(self) -> bool:
        """Workers publish what they hold and take nothing new."""
        return self is not DesiredState.RUNNING

    @property
    def ends_workers(self) -> bool:
        """Workers exit once drained (a drain with ``--stay`` excepted, see SourceControl)."""
        return self in (DesiredState.DRAINING, DesiredState.TERMINATING, DesiredState.TERMINATED)

    @property
    def terminal(self) -> bool:
        """Terminating or terminated: no worker starts, nothing overrides it but re-activation."""
        return self in (DesiredState.TERMINATING, DesiredState.TERMINATED)


class WorkerState(StrEnum):
    """What a worker reports in the registry and in ingest_worker_state (one-hot)."""

    STARTING = "starting"
    RUNNING = "running"
    # Running, but splits keep failing (see ConsumeLoop.unhealthy_reason).
    UNHEALTHY = "unhealthy"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    DRAINING = "draining"
    DRAINED = "drained"
    STOPPED = "stopped"
    FAILED = "failed"


class GapAction(StrEnum):
    """What happened at an offset gap (ingest_offset_gap_records_total)."""

    STOPPED = "stopped"
    SKIPPED = "skipped"


class SparkConnectEvent(StrEnum):
    """What the worker's Spark Connect session went through (ingest_spark_connect_events_total)."""

    # A call gave up on the server after its bounded retries (INGEST_SPARK_CONNECT_RETRY_S).
    UNREACHABLE = "unreachable"
    # The server answered that it no longer knows the session (it restarted).
    SESSION_LOST = "session_lost"
    # A fresh session replaced one lost or unreachable, before the next build.
    SESSION_RECREATED = "session_recreated"


class PartitionBy(StrEnum):
    """A transform of the event-time column that cuts data files (the spec's ``file_partition``)
    and partitions an Iceberg table (``ingest table-enable --partition-by``). Files cut by a
    transform lie in one partition of any table partitioned by it or a coarser one."""

    NONE = "none"
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"
    YEAR = "year"

    def covers(self, table: PartitionBy) -> bool:
        """Whether files cut by this transform each lie in one partition of ``table``'s."""
        if table is PartitionBy.NONE:
            return True
        if self is PartitionBy.NONE:
            return False
        order = (PartitionBy.HOUR, PartitionBy.DAY, PartitionBy.MONTH, PartitionBy.YEAR)
        return order.index(self) <= order.index(table)

    @staticmethod
    def finest(first: PartitionBy, *others: PartitionBy) -> PartitionBy:
        """The finest of the transforms: files it cuts lie in one partition of each one's."""
        cuts = (first, *others)
        return next(c for c in cuts if all(c.covers(o) for o in cuts))


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True, slots=True)
class PartitionClaim:
    """What the assign transaction returns for one newly assigned partition.

    ``serial`` is the value after this worker's bump: a publish for the partition is
    accepted only while the stored serial still equals it. ``next_offset`` is None only
    in the answer of the claim that finds nothing stored yet: the claimer resolves
    ``initial_position`` from the log once and stores it (pin_start_offsets) before it reads.
    """

    tp: TopicPartition
    serial: int
    next_offset: int | None
    initial_position: StartFrom
    # Kafka's leader epoch of the record at next_offset - 1, as its publish stored it (None:
    # unknown). The consumer seeks with it so librdkafka validates the position (KIP-320).
    leader_epoch: int | None = None
    # Its topic was deleted (a pattern source, migrations/0024): a topic of that name now is
    # another log, not read until a reset puts the partition in a new epoch.
    retired: bool = False
    # Kafka's id of the topic whose log next_offset is in (KIP-516, migrations/0027; None: not
    # known yet). A topic re-created under the name has another: the partition is stopped.
    topic_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredPosition:
    """A partition's row as a rewind reads it: the serial, and where to read from."""

    serial: int
    next_offset: int | None
    leader_epoch: int | None
    # Kafka's id of the topic whose log next_offset is in (None: not known yet).
    topic_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition. ``start`` is the consumer position the
    split began at (the previous split's end or the seek target), so consecutive splits of
    a partition tile its offsets without gaps even where Kafka's offsets have holes."""

    tp: TopicPartition
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class PublishRange:
    """One partition of a publish: the range plus the serial the worker saw at assign."""

    range: OffsetRange
    serial: int
    # Kafka's leader epoch of the record at range.end - 1, stored with the new next_offset
    # (None: unknown, the position is then used without validation).
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class BuiltSegment:
    """Files written for one split. Invisible until the publish transaction commits."""

    split_id: uuid.UUID
    location: str
    files: tuple[str, ...]
    row_count: int
    size_bytes: int
    min_event_time: datetime | None = None
    max_event_time: datetime | None = None
    rejects_location: str | None = None
    rejects_files: tuple[str, ...] = ()
    rejects_count: int = 0
    skipped_count: int = 0
    build_seconds: float = 0.0
    # (reason, count) for the records counted in rejects_count or skipped_count; reasons from PARSE_ERRORS.
    parse_errors: tuple[tuple[str, int], ...] = ()
    # The bytes of the records' keys and values as read from Kafka (the partition's bytes per
    # offset: ingest.consume.cutter), and the newest record's Kafka timestamp (ms; None: none).
    record_bytes: int = 0
    last_timestamp_ms: int | None = None
    # The offsets of the split's range that hold no record the build read (transaction markers,
    # aborted records, compacted-away offsets): end - start - records. None: not observed.
    holes: int | None = None

    @property
    def records(self) -> int:
        """Every record of the split: published, rejected or skipped."""
        return self.row_count + self.rejects_count + self.skipped_count


@dataclass(frozen=True, slots=True)
class BuildRegistration:
    """What a build writes, registered in the metastore before it writes anything: its
    directories (canonical URIs) and the splits whose files will lie in them."""

    build_id: uuid.UUID
    source: str
    staging: str
    data: str
    rejects: str
    split_ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class SegmentToPublish:
    source: str
    spec_version: int
    worker_id: str
    segment: BuiltSegment
    ranges: tuple[PublishRange, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class LastAudit:
    """The result of a source's newest ``ingest audit`` run (ingest_audits)."""

    findings: int
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class SourceControl:
    """What operators asked of a source, as workers read it with their heartbeat."""

    desired_state: DesiredState
    drain_stay: bool
    # Bumped by every `ingest reset`; a worker that sees it change re-claims reset partitions.
    reset_generation: int
    # The latest applied spec version.
    spec_version: int
    # The source's last `ingest audit` (None: never audited): exported, not a control, so a
    # new audit is no control change.
    last_audit: LastAudit | None = field(default=None, compare=False)

    @property
    def terminated(self) -> bool:
        return self.desired_state is DesiredState.TERMINATED


@dataclass(frozen=True, slots=True)
class PartitionReset:
    """One partition of an ``ingest reset``: offsets before and after, what it skips
    (``[start, end)`` never published) or replays (``[start, end)`` published once already)."""

    tp: TopicPartition
    old_offset: int | None
    new_offset: int
    skipped: tuple[int, int] | None = None
    replayed: tuple[int, int] | None = None
    old_serial: int = 0
    new_serial: int = 0


@dataclass(frozen=True, slots=True)
class ResetResult:
    """The plan of a reset, and whether it was applied (``reset_id`` set)."""

    partitions: tuple[PartitionReset, ...]
    reset_id: int | None = None

    @property
    def changes_data(self) -> bool:
        return any(p.skipped or p.replayed for p in self.partitions)
