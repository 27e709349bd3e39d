"""A source spec as data: the validated spec (ingest.spec.parse makes it) and its JSON form,
how the metastore stores it, which round-trips without loss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ingest.formats.registry import RegistrySettings, SchemaFrom
from ingest.formats.wire import KEY_COLUMN_PREFIX, STRING_KEY_COLUMN
from ingest.spec.table import TableSettings
from ingest.topics import subscription_pattern, topic_matches
from ingest_common.model import PartitionBy, StartFrom
from ingest_common.store_uri import canonical_store_uri

ParseErrorPolicy = Literal["reject", "skip", "fail"]
# What a partition does when its stored offset is no longer in the log (retention, a
# re-created topic): stop (default), or move to the earliest offset and record the skipped
# range in the gap ledger. Never silently.
OutOfRangePolicy = Literal["fail", "earliest"]


@dataclass(frozen=True, slots=True)
class SplitLimits:
    max_records: int = 100_000
    max_bytes: int = 64 * 1024**2
    max_age_s: float = 30.0
    # Backpressure: past either bound the worker pauses its partitions (poll() keeps going).
    max_in_flight: int = 16
    max_in_flight_bytes: int = 512 * 1024**2


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    """``ingest compact``: segments whose files are smaller than the target are rewritten into
    files of about the target (ingest.compact)."""

    target_file_bytes: int = 256 * 1024**2


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    topics: tuple[str, ...]
    schema: tuple[tuple[str, str], ...]
    event_time: str
    segment_store: str
    start_from: StartFrom = "earliest"
    # Instead of ``topics`` (which is then empty): every topic whose name matches this regex
    # (librdkafka's subscription by a pattern starting with "^"), internal "__" topics excepted.
    topic_pattern: str = ""
    format: str = "json"
    on_parse_error: ParseErrorPolicy = "reject"
    split: SplitLimits = SplitLimits()
    consumer_group: str = ""
    on_offset_out_of_range: OutOfRangePolicy = "fail"
    # Data files are cut by this transform of the event time (one directory per value under the
    # build): every file then lies in one partition of an Iceberg table partitioned by it or
    # by a coarser transform (Iceberg registers a file only whole).
    file_partition: PartitionBy = PartitionBy.NONE
    # Formats avro and json_schema: the registry their records' schema ids refer to.
    registry: RegistrySettings | None = None
    # Format avro: where the reader schema comes from, and the reader schema itself (Avro
    # JSON), fixed when the spec is applied (resolve_registry_schema) and stored with it.
    schema_from: SchemaFrom = "spec"
    reader_schema: str = ""
    # How keys are decoded beside ``_key`` (which stays binary): KEY_FORMATS; avro and
    # json_schema read the fields of ``key_schema`` (column = type, as ``schema``).
    key_format: str = "binary"
    key_schema: tuple[tuple[str, str], ...] = ()

    @property
    def key_columns(self) -> tuple[tuple[str, str], ...]:
        """The output columns of the decoded key, after ``_key`` and before the schema's."""
        if self.key_format == "string":
            return ((STRING_KEY_COLUMN, "string"),)
        return tuple((KEY_COLUMN_PREFIX + name, ctype) for name, ctype in self.key_schema)

    compaction: CompactionSettings = CompactionSettings()
    # [table]: the Iceberg catalog of the source's tables (none: the metastore's own).
    table: TableSettings = field(default_factory=TableSettings)

    @property
    def subscription(self) -> list[str]:
        """What the group member subscribes to: the topics, or the pattern."""
        return [subscription_pattern(self.topic_pattern)] if self.topic_pattern else list(self.topics)

    def matches(self, topic: str) -> bool:
        """Is ``topic`` one of the source's (named, or matching its pattern)."""
        return topic_matches(self.topics, self.topic_pattern, topic)

    @property
    def group_id(self) -> str:
        # Same rule as metastore.store.group_id, which checks it is unique across sources.
        return self.consumer_group or f"ingest-{self.name}"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["topics"] = list(self.topics)
        doc["schema"] = [list(c) for c in self.schema]
        doc["key_schema"] = [list(c) for c in self.key_schema]
        doc["table"] = self.table.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SourceSpec:
        return cls(
            name=doc["name"],
            topics=tuple(doc["topics"]),
            schema=tuple((c[0], c[1]) for c in doc["schema"]),
            event_time=doc["event_time"],
            # Stored before URIs were canonical: one spelling per place from here on.
            segment_store=canonical_store_uri(doc["segment_store"]),
            start_from=doc["start_from"],
            topic_pattern=doc.get("topic_pattern", ""),
            format=doc["format"],
            on_parse_error=doc["on_parse_error"],
            split=SplitLimits(**doc["split"]),
            consumer_group=doc.get("consumer_group", ""),
            # Specs stored before the option existed had the "fail" behaviour.
            on_offset_out_of_range=doc.get("on_offset_out_of_range", "fail"),
            file_partition=PartitionBy(doc.get("file_partition", PartitionBy.NONE)),
            registry=RegistrySettings(**doc["registry"]) if doc.get("registry") else None,
            schema_from=doc.get("schema_from", "spec"),
            reader_schema=doc.get("reader_schema", ""),
            key_format=doc.get("key_format", "binary"),
            key_schema=tuple((c[0], c[1]) for c in doc.get("key_schema", ())),
            # Specs stored before compaction existed have its defaults.
            compaction=CompactionSettings(**doc.get("compaction", {})),
            table=TableSettings.from_json(doc.get("table")),
        )
