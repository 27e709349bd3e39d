"""Spark turns a sealed split into Parquet files that stay invisible until published.

The records are staged as one Parquet file (Kafka coordinates plus raw key and value
bytes); one Spark job reads it, parses the values against the source's schema, and
writes the good rows as zstd Parquet. The job also observes, in the same pass, how many
rows failed to parse and the event-time range. Rejected records go to a second job only
when there are any.

Invariant: ``row_count + rejects_count + skipped_count == len(split)``; anything else is
a BuildError. Every failure deletes what the build wrote.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from ingest import segment_store
from ingest.errors import BuildError, ParseFailure, SplitKilled
from ingest.model import PARSE_ERRORS, BuiltSegment, TopicPartition
from ingest.spec import SourceSpec
from ingest.split import KillSwitch, SealedSplit

log = structlog.get_logger(__name__)

CORRUPT = "_corrupt"
# Fail if the split's directory exists (split ids are fresh). "error", not its alias
# "errorifexists": the Spark Connect client only knows the short name.
WRITE_MODE = "error"
META_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key")
STAGED_SCHEMA = pa.schema([
    ("_topic", pa.string()),
    ("_partition", pa.int32()),
    ("_offset", pa.int64()),
    ("_timestamp", pa.timestamp("ms", tz="UTC")),
    ("_key", pa.binary()),
    ("_value", pa.binary()),
])
STAGED_DDL = "_topic string, _partition int, _offset bigint, _timestamp timestamp, _key binary, _value binary"


class SegmentBuilder(Protocol):
    def build(self, split: SealedSplit, spec: SourceSpec) -> BuiltSegment: ...
    def discard(self, segment: BuiltSegment) -> None: ...


def stage_records(split: SealedSplit) -> pa.Table:
    records = split.records
    timestamps = []
    for r in records:
        kind, ms = r.timestamp()
        timestamps.append(ms if kind != 0 else None)  # 0: TIMESTAMP_NOT_AVAILABLE
    n = len(records)
    return pa.table([
        pa.array([split.tp.topic] * n, pa.string()),
        pa.array([split.tp.partition] * n, pa.int32()),
        pa.array([r.offset() for r in records], pa.int64()),
        pa.array(timestamps, pa.timestamp("ms", tz="UTC")),
        pa.array([r.key() for r in records], pa.binary()),
        pa.array([r.value() for r in records], pa.binary()),
    ], schema=STAGED_SCHEMA)


def spark_type(name: str) -> Any:
    from pyspark.sql import types as T

    scalars = {
        "string": T.StringType(), "long": T.LongType(), "int": T.IntegerType(), "double": T.DoubleType(),
        "float": T.FloatType(), "boolean": T.BooleanType(), "timestamp": T.TimestampType(), "date": T.DateType(),
    }
    if name.startswith("array<") and name.endswith(">"):
        return T.ArrayType(scalars[name[6:-1]])
    return scalars[name]


@dataclass(frozen=True)
class _Plan:
    """Spark column expressions of one build (unresolved, so reusable by every split)."""

    staged_columns: tuple[Any, ...]
    error: Any
    observed: tuple[Any, ...]
    good: Any
    output_columns: tuple[Any, ...]


def _make_plan(spec: SourceSpec) -> _Plan:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField(name, spark_type(ctype), True) for name, ctype in spec.schema]
        + [T.StructField(CORRUPT, T.StringType(), True)]
    )
    value = F.col("_value")
    text = value.cast("string")
    parsed = F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    event_time = F.col("_p").getField(spec.event_time)
    corrupt = F.col("_p").getField(CORRUPT)
    # Cheap checks first; the second parse (json_object_keys) runs for bad rows only.
    error = (
        F.when(value.isNull(), F.lit("null_value"))
        .when(~F.is_valid_utf8(value), F.lit("invalid_utf8"))
        # from_json gives a null struct (not a corrupt record) for blank input and `null`.
        .when(F.col("_p").isNull(), F.lit("invalid_json"))
        .when(corrupt.isNull() & event_time.isNotNull(), F.lit(None).cast("string"))
        .when(corrupt.isNull(), F.lit("missing_event_time"))
        .when(F.json_object_keys(text).isNull(), F.lit("invalid_json"))
        .otherwise(F.lit("type_mismatch"))
    )
    good = F.col("_error").isNull()
    good_time = F.unix_micros(F.when(good, event_time))
    return _Plan(
        staged_columns=(*(F.col(c) for c in META_COLUMNS), value, parsed.alias("_p")),
        error=error,
        observed=(
            F.count(F.lit(1)).alias("total"),
            F.count("_error").alias("errors"),
            F.min(good_time).alias("min_us"),
            F.max(good_time).alias("max_us"),
            *(F.count(F.when(F.col("_error") == F.lit(reason), 1)).alias(reason) for reason in PARSE_ERRORS),
        ),
        good=good,
        output_columns=(*(F.col(c) for c in META_COLUMNS),
                        *(F.col("_p").getField(name).alias(name) for name, _ in spec.schema)),
    )


class _SyntheticRecord:
    __slots__ = ("_offset", "_value")

    def __init__(self, offset: int, value: bytes) -> None:
        self._offset = offset
        self._value = value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 946_684_800_000)

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self._value


def _utc(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1_000_000, tz=UTC)


class SparkSegmentBuilder:
    """Safe to call from several threads with one SparkSession (jobs are tagged per split)."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._plans: dict[tuple[tuple[tuple[str, str], ...], str], _Plan] = {}
        self._plans_lock = threading.Lock()

    def build(self, split: SealedSplit, spec: SourceSpec) -> BuiltSegment:
        started = time.monotonic()
        kill = split.kill_switch
        kill.check()
        staged = segment_store.staging_file(spec.segment_store, spec.name, split.id)
        data_dir = segment_store.segment_dir(spec.segment_store, spec.name, split.id)
        rejects_dir = segment_store.rejects_dir(spec.segment_store, spec.name, split.id)
        tag = f"ingest-split-{split.id}"
        kill.on_trip(lambda _reason: self._interrupt(tag))
        try:
            self._stage(split, staged)
            kill.check()
            self._spark.addTag(tag)
            try:
                built = self._run(split, spec, staged, data_dir, rejects_dir)
            finally:
                self._spark.removeTag(tag)
            kill.check()
        except (SplitKilled, ParseFailure):
            self._cleanup(data_dir, rejects_dir)
            raise
        except Exception as exc:
            self._cleanup(data_dir, rejects_dir)
            if kill.tripped:
                raise SplitKilled(kill.reason or "killed") from exc
            raise BuildError(f"building split {split.id} of {split.tp} failed: {_first_line(exc)}") from exc
        finally:
            self._cleanup(staged)
        elapsed = time.monotonic() - started
        log.debug("split_built", split=str(split.id), rows=built.row_count, seconds=round(elapsed, 3))
        return _with_build_time(built, elapsed)

    def warm_up(self, spec: SourceSpec, records: int = 2000) -> float:
        """Build and discard a synthetic split before the worker joins its group, so the
        first real split does not pay for the JVM's class loading, JIT and code generation
        (seconds on a cold JVM). Returns the seconds it took."""
        started = time.monotonic()
        good = json.dumps({spec.event_time: "2000-01-01T00:00:00Z"}).encode()
        synthetic = tuple(_SyntheticRecord(i, good if i % 100 else b"{") for i in range(records))
        split = SealedSplit(id=uuid.uuid4(), tp=TopicPartition("_warm_up", 0), serial=0, start=0, end=records,
                            records=synthetic, size_bytes=len(good) * records, first_record_at=started,
                            sealed_at=started, seal_reason="warm_up", kill_switch=KillSwitch())
        # Policy "fail" stops at the synthetic bad record: the parse path ran all the same.
        with contextlib.suppress(ParseFailure):
            self.discard(self.build(split, spec))
        return time.monotonic() - started

    def discard(self, segment: BuiltSegment) -> None:
        self._cleanup(segment.location, *([segment.rejects_location] if segment.rejects_location else []))

    # -- internals -----------------------------------------------------------------

    def _interrupt(self, tag: str) -> None:
        try:
            self._spark.interruptTag(tag)
        except Exception as exc:  # the session may be stopping; the kill switch still holds
            log.warning("spark_interrupt_failed", tag=tag, error=str(exc))

    @staticmethod
    def _stage(split: SealedSplit, uri: str) -> None:
        segment_store.ensure_parent(uri)
        fs, path = segment_store.filesystem(uri)
        pq.write_table(stage_records(split), path, filesystem=fs, compression="none")

    def _plan(self, spec: SourceSpec) -> _Plan:
        """The column expressions of a build, made once per (schema, event time): building
        them costs hundreds of Py4J round trips, which would otherwise be paid per split and
        contend for the GIL with the consumer thread."""
        key = (spec.schema, spec.event_time)
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = _make_plan(spec)
            return plan

    def _run(self, split: SealedSplit, spec: SourceSpec, staged: str, data_dir: str,
             rejects_dir: str) -> BuiltSegment:
        from pyspark.sql import Observation

        plan = self._plan(spec)
        # The staged schema is fixed: giving it saves reading the footer to infer it.
        df = (self._spark.read.schema(STAGED_DDL).parquet(staged)
              .select(*plan.staged_columns).withColumn("_error", plan.error))
        observation = Observation(f"split-{split.id}")
        observed = df.observe(observation, *plan.observed)
        (observed.filter(plan.good).select(*plan.output_columns)
         .write.mode(WRITE_MODE).option("compression", "zstd").parquet(data_dir))
        stats = observation.get
        total, errors = int(stats["total"]), int(stats["errors"])
        if total != len(split):
            raise BuildError(f"split {split.id}: Spark read {total} rows, the split has {len(split)}")

        rejects_files: list[tuple[str, int]] = []
        skipped = 0
        if errors and spec.on_parse_error == "fail":
            first = (df.filter(~plan.good).select("_offset", "_error")
                     .orderBy("_offset").limit(1).collect()[0])
            raise ParseFailure(split.tp.topic, split.tp.partition, int(first["_offset"]), str(first["_error"]))
        if errors and spec.on_parse_error == "reject":
            split.kill_switch.check()
            (df.filter(~plan.good).select(*META_COLUMNS, "_value", "_error")
             .write.mode(WRITE_MODE).option("compression", "zstd").parquet(rejects_dir))
            rejects_files = segment_store.list_files(rejects_dir)
        elif errors:
            skipped = errors

        by_reason = tuple((reason, int(stats[reason])) for reason in PARSE_ERRORS if stats[reason])
        if sum(n for _, n in by_reason) != errors:
            raise BuildError(f"split {split.id}: {errors} parse errors, by reason {by_reason}")
        files = segment_store.list_files(data_dir)
        return BuiltSegment(
            split_id=split.id,
            location=data_dir,
            files=tuple(uri for uri, _ in files),
            row_count=total - errors,
            size_bytes=sum(size for _, size in files) + sum(size for _, size in rejects_files),
            min_event_time=_utc(stats["min_us"]),
            max_event_time=_utc(stats["max_us"]),
            rejects_location=rejects_dir if rejects_files else None,
            rejects_files=tuple(uri for uri, _ in rejects_files),
            rejects_count=errors if rejects_files else 0,
            skipped_count=skipped,
            parse_errors=by_reason,
        )

    @staticmethod
    def _cleanup(*uris: str) -> None:
        for uri in uris:
            try:
                segment_store.delete_dir(uri)
            except OSError as exc:
                log.warning("cleanup_failed", uri=uri, error=str(exc))


def _with_build_time(built: BuiltSegment, seconds: float) -> BuiltSegment:
    from dataclasses import replace

    return replace(built, build_seconds=seconds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
