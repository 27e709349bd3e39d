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

import time
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from ingest import segment_store
from ingest.errors import BuildError, ParseFailure, SplitKilled
from ingest.model import PARSE_ERRORS, BuiltSegment
from ingest.spec import SourceSpec
from ingest.split import SealedSplit

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


def _utc(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1_000_000, tz=UTC)


class SparkSegmentBuilder:
    """Safe to call from several threads with one SparkSession (jobs are tagged per split)."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

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

    def _run(self, split: SealedSplit, spec: SourceSpec, staged: str, data_dir: str,
             rejects_dir: str) -> BuiltSegment:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        schema = T.StructType(
            [T.StructField(name, spark_type(ctype), True) for name, ctype in spec.schema]
            + [T.StructField(CORRUPT, T.StringType(), True)]
        )
        value = F.col("_value")
        text = value.cast("string")
        parsed = F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        df = self._spark.read.parquet(staged).select(*META_COLUMNS, "_value", parsed.alias("_p"))
        event_time = F.col("_p").getField(spec.event_time)
        corrupt = F.col("_p").getField(CORRUPT)
        # Cheap checks first; the second parse (json_object_keys) runs for bad rows only.
        error = (
            F.when(value.isNull(), F.lit("null_value"))
            .when(~F.is_valid_utf8(value), F.lit("invalid_utf8"))
            # from_json gives no struct at all (not even a corrupt-record one) for empty or blank input.
            .when(F.col("_p").isNull(), F.lit("invalid_json"))
            .when(corrupt.isNull() & event_time.isNotNull(), F.lit(None).cast("string"))
            .when(corrupt.isNull(), F.lit("missing_event_time"))
            .when(F.json_object_keys(text).isNull(), F.lit("invalid_json"))
            .otherwise(F.lit("type_mismatch"))
        )
        df = df.withColumn("_error", error)
        good_time = F.unix_micros(F.when(F.col("_error").isNull(), event_time))
        observation = Observation(f"split-{split.id}")
        observed = df.observe(
            observation,
            F.count(F.lit(1)).alias("total"),
            F.count("_error").alias("errors"),
            F.min(good_time).alias("min_us"),
            F.max(good_time).alias("max_us"),
            *(F.count(F.when(F.col("_error") == F.lit(reason), 1)).alias(reason) for reason in PARSE_ERRORS),
        )
        columns = [*META_COLUMNS, *(F.col("_p").getField(name).alias(name) for name, _ in spec.schema)]
        (observed.filter(F.col("_error").isNull()).select(*columns)
         .write.mode(WRITE_MODE).option("compression", "zstd").parquet(data_dir))
        stats = observation.get
        total, errors = int(stats["total"]), int(stats["errors"])
        if total != len(split):
            raise BuildError(f"split {split.id}: Spark read {total} rows, the split has {len(split)}")

        rejects_files: list[tuple[str, int]] = []
        skipped = 0
        if errors and spec.on_parse_error == "fail":
            first = (df.filter(F.col("_error").isNotNull()).select("_offset", "_error")
                     .orderBy("_offset").limit(1).collect()[0])
            raise ParseFailure(split.tp.topic, split.tp.partition, int(first["_offset"]), str(first["_error"]))
        if errors and spec.on_parse_error == "reject":
            split.kill_switch.check()
            (df.filter(F.col("_error").isNotNull()).select(*META_COLUMNS, "_value", "_error")
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
