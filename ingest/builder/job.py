"""Spark turns sealed splits into Parquet files that stay invisible until published.

Splits are built in batches: every split of a batch is staged as its own Parquet file
(Kafka coordinates plus raw key and value bytes), and one Spark job reads them all, parses
the values against the source's schema and writes the good rows as zstd Parquet, one task
per staged file. A job has a fixed cost (planning, and on a young JVM compiling the
planner's code) that would otherwise be paid per split. The output files are then told
apart by their footers (``ingest.segments.output_files``) and stay where Spark wrote them: each
split's segment lists its own files. Records that failed to parse go through a second job
only when there are any. What a job computes (the staged layout, the parse expressions) is
:mod:`ingest.builder.plan`; this module runs it and accounts for every record.

Invariants, per build: its directories and splits are registered in the metastore before
anything is written (``ingest.builder.registration``); per split: ``row_count + rejects_count +
skipped_count == len(split)``, anything else is a BuildError. Every failure deletes what
the build wrote. One split's failure (killed, bad input under ``fail``) does not fail the
others of its batch.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from ingest.builder.plan import FILE_PARTITION_COLUMN, META_COLUMNS, STAGED_DDL, Plan, PlanCache, Writers, stage_records
from ingest.builder.registration import BuildRegistrar
from ingest.builder.writer_schemas import BatchSchemas, WriterSchemas, resolvable
from ingest.errors import BuildError, ParseFailure, SplitKilled, WorkerFailed, first_line
from ingest.segments import output_files
from ingest.segments import store as segment_store
from ingest.spark.session import FixedSession, JobInterrupts, SessionSource
from ingest.spec import SourceSpec
from ingest.splits.chunks import chunks_of
from ingest.splits.split import KillSwitch, SealedSplit, SyntheticRecord
from ingest_common.model import PARSE_ERRORS, BuildRegistration, BuiltSegment, TopicPartition

log = structlog.get_logger(__name__)

# Fail if the split's directory exists (split ids are fresh). "error", not its alias
# "errorifexists": the Spark Connect client only knows the short name.
WRITE_MODE = "error"

#: The largest dictionary a segment's column keeps (parquet-mr's default is 1 MiB). A column
#: whose distinct values outgrow it is written plain from there on: with the default, every value
#: of a split's high-cardinality columns (offsets, ids, timestamps, session strings) was hashed
#: into a dictionary the writer dropped when the file closed, ~30 % of the build's JVM CPU at
#: 100k-record batches (docs/benchmarks.md, "Parquet dictionaries"). Columns of few values (a
#: country, a device, the topic) keep theirs, and zstd sees to the rest: file sizes were within
#: 1 %. Compaction writes with the default: the files it leaves are the ones read for long.
DICTIONARY_PAGE_BYTES = 32 * 1024


# What building one split of a batch gave: its segment, or why there is none (SplitKilled,
# ParseFailure under policy "fail", BuildError; RegistryUnavailable, a BuildError: not built
# yet, the schema registry did not answer for one of its writer schema ids).
BuildResult = BuiltSegment | Exception


class SegmentBuilder(Protocol):
    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuildResult]:
        """One result per split, in order. Raises nothing for a split's own failure."""
        ...

    def discard(self, segment: BuiltSegment) -> None: ...


# How a worker makes its builder: given the registrar every build registers with first.
BuilderFactory = Callable[[BuildRegistrar], SegmentBuilder]


_WARM_UP_VALUES: dict[str, Any] = {
    "string": "warm-up",
    "long": 1_795_000_000_123,
    "int": 42,
    "double": 12.5,
    "float": 0.25,
    "boolean": True,
    "timestamp": "2026-11-23T10:00:00.123Z",
    "date": "2026-11-23",
}


def warm_up_value(spec: SourceSpec) -> bytes:
    """A JSON record with a value of the right type in every column of the schema."""
    doc = {
        name: [_WARM_UP_VALUES[ctype[6:-1]]] * 3 if ctype.startswith("array<") else _WARM_UP_VALUES[ctype]
        for name, ctype in spec.schema
    }
    return json.dumps(doc).encode()


#: The schema id of the warm-up's Avro records: Confluent-compatible registries give out ids
#: from 1, and the warm-up hands its writer schema to the build itself (no registry asked).
WARM_UP_SCHEMA_ID = 0
_WARM_UP_AVRO: dict[str, Any] = {
    "string": "warm-up",
    "long": 1,
    "int": 1,
    "double": 0.5,
    "float": 0.25,
    "boolean": True,
    "timestamp": datetime(2026, 11, 23, 10, 0, 0, 123000, tzinfo=UTC),
    "date": date(2026, 11, 23),
}


def warm_up_avro(spec: SourceSpec) -> tuple[bytes, str]:
    """A framed Avro record with a value of the right type in every column, and its writer
    schema (the spec's reader schema: it resolves to itself), so the warm-up runs from_avro."""
    import fastavro

    record = {
        name: [_WARM_UP_AVRO[ctype[6:-1]]] * 3 if ctype.startswith("array<") else _WARM_UP_AVRO[ctype]
        for name, ctype in spec.schema
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(json.loads(spec.reader_schema)), record)
    framed = b"\x00" + WARM_UP_SCHEMA_ID.to_bytes(4, "big") + body.getvalue()
    return framed, spec.reader_schema


def _utc(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1_000_000, tz=UTC)


class SparkSegmentBuilder:
    """Safe to call from several threads with one SparkSession (jobs are tagged per batch).
    ``spark``: a session, or the SessionSource that owns it (each batch takes the current
    session and reports its failure there: a Connect session the server lost is replaced)."""

    def __init__(
        self, spark: Any, registrar: BuildRegistrar, dictionary_page_bytes: int = DICTIONARY_PAGE_BYTES
    ) -> None:
        self._sessions = spark if isinstance(spark, SessionSource) else FixedSession(spark)
        self._dictionary_page_bytes = dictionary_page_bytes
        self._interrupts = JobInterrupts(self._sessions)
        self._registrar = registrar
        self._plans = PlanCache()
        self._writer_schemas = WriterSchemas()

    def build(self, split: SealedSplit, spec: SourceSpec) -> BuiltSegment:
        """One split on its own: its segment, or the exception its build ended with."""
        result = self.build_batch([split], spec)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuildResult]:
        started = time.monotonic()
        results: dict[uuid.UUID, BuildResult] = {}
        live = []
        for split in splits:
            if split.kill_switch.tripped:
                results[split.id] = SplitKilled(split.kill_switch.reason or "killed")
            else:
                live.append(split)
        fetched = BatchSchemas({}, {})
        if live and (spec.format in ("avro", "protobuf") or spec.key_format == "avro"):
            # Fetched before the build registers or writes anything: a split holding an id the
            # registry did not answer for is not built now, and waits (ingest.builder.writer_schemas).
            assert spec.registry is not None  # validated with the spec
            fetched = self._writer_schemas.for_batch(
                live,
                spec.registry,
                values=spec.format in ("avro", "protobuf"),
                keys=spec.key_format == "avro",
                protobuf=spec.format == "protobuf",
            )
            results.update(fetched.waiting)
            live = [split for split in live if split.id not in fetched.waiting]
        if live:
            results.update(self._build_live(live, spec, fetched))
        elapsed = time.monotonic() - started
        log.debug("batch_built", splits=len(splits), records=sum(len(s) for s in splits), seconds=round(elapsed, 3))
        return [
            replace(r, build_seconds=elapsed) if isinstance(r, BuiltSegment) else r
            for r in (results[split.id] for split in splits)
        ]

    def warm_up(self, spec: SourceSpec, records: int, splits: int = 2) -> float:
        """Build and discard ``records`` synthetic records, dealt over ``splits`` splits of one
        batch, before the worker joins its group, so the first real splits do not pay for the
        JVM's class loading, JIT and code generation (seconds on a cold JVM). The synthetic
        values fill every column of the schema with a value of its type, so the JIT compiles
        the parse paths real records take; several splits, so the batch's tasks run (and are
        compiled) on several executor threads. Returns the seconds it took."""
        started = time.monotonic()
        splits = max(1, min(splits, records))
        per_split = -(-records // splits)
        good = warm_up_value(spec)
        fetched = BatchSchemas({}, {})
        if spec.format == "avro":
            good, writer = warm_up_avro(spec)
            fetched = BatchSchemas({WARM_UP_SCHEMA_ID: writer}, {})
        # Every 100th record is bad, so the rejects path is compiled too.
        batch = [
            SealedSplit(
                id=uuid.uuid4(),
                tp=TopicPartition("_warm_up", n),
                serial=0,
                start=0,
                end=per_split,
                chunks=chunks_of([SyntheticRecord(i, good if i % 100 else b"{") for i in range(per_split)]),
                size_bytes=len(good) * per_split,
                first_record_at=started,
                sealed_at=started,
                seal_reason="warm_up",
                kill_switch=KillSwitch(),
            )
            for n in range(splits)
        ]
        built = self._build_live(batch, spec, fetched)
        for result in (built[split.id] for split in batch):
            # Policy "fail" stops at the synthetic bad record: the parse path ran all the same.
            if isinstance(result, BuiltSegment):
                self.discard(result)
            elif not isinstance(result, ParseFailure):
                raise result
        return time.monotonic() - started

    def discard(self, segment: BuiltSegment) -> None:
        """Delete a segment's own files (its directories hold other splits' files too)."""
        self._cleanup(*segment.files, *segment.rejects_files)

    # -- internals -----------------------------------------------------------------

    def _build_live(
        self, splits: list[SealedSplit], spec: SourceSpec, fetched: BatchSchemas
    ) -> dict[uuid.UUID, BuildResult]:
        build = uuid.uuid4()
        dirs = segment_store.build_dirs(spec.segment_store, spec.name, build)
        staged = {split.id: segment_store.staging_file(dirs.staging, split.id) for split in splits}
        tag = f"ingest-batch-{build}"
        self._interrupt_when_all_killed(splits, tag)
        registered = False
        spark: Any = None
        try:
            spark = self._sessions.current()
            self._registrar.register(
                BuildRegistration(
                    build, spec.name, dirs.staging, dirs.data, dirs.rejects, tuple(split.id for split in splits)
                ),
                splits,
            )
            registered = True
            for split in splits:
                self._stage(split, staged[split.id])
            if all(split.kill_switch.tripped for split in splits):
                raise SplitKilled("killed")
            spark.addTag(tag)
            try:
                return self._run(spark, splits, spec, fetched, staged, dirs.data, dirs.rejects)
            finally:
                spark.removeTag(tag)
        except Exception as exc:
            if spark is not None:
                self._sessions.failed(spark, exc)
            if registered:
                self._cleanup(dirs.data, dirs.rejects)
            if isinstance(exc, WorkerFailed):
                # No build can run in this process again (SparkDriverExited): not one to retry.
                return {split.id: exc for split in splits}
            if not isinstance(exc, BuildError | SplitKilled):
                log.warning(
                    "batch_failed",
                    batch=str(build),
                    splits=len(splits),
                    error=first_line(exc),
                    exc_info=not _is_spark_error(exc),
                )
            failed: dict[uuid.UUID, BuildResult] = {}
            for split in splits:
                if split.kill_switch.tripped:
                    failed[split.id] = SplitKilled(split.kill_switch.reason or "killed")
                else:
                    failed[split.id] = BuildError(
                        f"building split {split.id} of {split.tp} (batch of {len(splits)}) failed: {first_line(exc)}"
                    )
            return failed
        finally:
            if registered:
                self._cleanup(dirs.staging)

    def _interrupt_when_all_killed(self, splits: list[SealedSplit], tag: str) -> None:
        """A killed split's output is dropped after the job; the job itself is interrupted
        only once no split of its batch is left to build."""
        remaining = {split.id for split in splits}
        lock = threading.Lock()

        def on_trip(split_id: uuid.UUID) -> Callable[[str], None]:
            def tripped(_reason: str) -> None:
                with lock:
                    remaining.discard(split_id)
                    last = not remaining
                if last:
                    # Runs in the tripping thread (a rebalance callback): handed off, never waited for.
                    self._interrupts.request(tag)

            return tripped

        for split in splits:
            split.kill_switch.on_trip(on_trip(split.id))

    @staticmethod
    def _stage(split: SealedSplit, uri: str) -> None:
        segment_store.ensure_parent(uri)
        fs, path = segment_store.filesystem(uri)
        # Read once, by one Spark task: no compression, no statistics, and dictionaries only
        # for the columns that repeat one value (the values and keys rarely repeat).
        pq.write_table(
            stage_records(split),
            path,
            filesystem=fs,
            compression="none",
            use_dictionary=["_topic", "_partition"],
            write_statistics=False,
        )

    def _plan(self, spec: SourceSpec, fetched: BatchSchemas) -> Plan:
        """The writer schemas were fetched before (a registry that does not answer makes the
        splits wait, ingest.builder.writer_schemas); each Avro value writer is checked against
        the reader schema here: a writer it cannot resolve is left out of the job, its records
        rejects (a from_avro it cannot resolve would fail the job or decode nothing)."""
        avro, unresolvable = resolvable(spec, fetched.schemas) if spec.format == "avro" else ({}, frozenset())
        return self._plans.get(spec, Writers(avro, unresolvable, fetched.key_schemas, fetched.protobuf))

    def _parse(
        self, spark: Any, plan: Plan, staged: list[str], good: bool, out_dir: str, columns: Sequence[Any]
    ) -> int:
        """One Spark job: parse the staged files, write the good (or the bad) rows to
        ``out_dir``. Returns the number of rows read."""
        from pyspark.sql import Observation

        # The staged schema is fixed: giving it saves reading the footers to infer it.
        df = spark.read.schema(STAGED_DDL).parquet(*staged)
        if plan.decode is not None:
            df = plan.decode(df)
        df = df.select(*plan.staged_columns).withColumn("_error", plan.error)
        observation = Observation(f"build-{uuid.uuid4().hex}")
        rows = df.observe(observation, plan.total).filter(plan.good if good else ~plan.good)
        if good and plan.file_partition is not None:
            # One file per (task, value): a task still reads one staged file, so a file stays
            # within one split (ingest.segments.output_files), and now within one partition value too.
            rows = rows.select(*columns, plan.file_partition.alias(FILE_PARTITION_COLUMN))
            writer = rows.write.partitionBy(FILE_PARTITION_COLUMN)
        else:
            writer = rows.select(*columns).write
        writer = writer.option("parquet.dictionary.page.size", str(self._dictionary_page_bytes))
        writer.mode(WRITE_MODE).option("compression", "zstd").parquet(out_dir)
        return int(observation.get["total"])

    def _run(
        self,
        spark: Any,
        splits: list[SealedSplit],
        spec: SourceSpec,
        fetched: BatchSchemas,
        staged: dict[uuid.UUID, str],
        data_dir: str,
        rejects_dir: str,
    ) -> dict[uuid.UUID, BuildResult]:
        plan = self._plan(spec, fetched)
        total = self._parse(spark, plan, [staged[s.id] for s in splits], True, data_dir, plan.output_columns)
        expected = sum(len(split) for split in splits)
        if total != expected:
            raise BuildError(f"Spark read {total} rows, the batch's {len(splits)} splits have {expected}")
        data = output_files.attribute(data_dir, splits, spec.event_time)
        rejected: dict[uuid.UUID, list[output_files.OutputFile]] = {split.id: [] for split in splits}
        short = [s for s in splits if sum(f.rows for f in data[s.id]) < len(s) and not s.kill_switch.tripped]
        if short:
            self._parse(
                spark, plan, [staged[s.id] for s in short], False, rejects_dir, (*META_COLUMNS, "_value", "_error")
            )
            rejected.update(output_files.attribute(rejects_dir, short))
        return {
            split.id: self._finish(split, spec, data[split.id], rejected[split.id], data_dir, rejects_dir)
            for split in splits
        }

    def _finish(
        self,
        split: SealedSplit,
        spec: SourceSpec,
        files: list[output_files.OutputFile],
        rejects: list[output_files.OutputFile],
        data_dir: str,
        rejects_dir: str,
    ) -> BuildResult:
        """Apply the parse-error policy to one split of the batch: its segment lists its
        files where Spark wrote them, or they are deleted."""

        def drop() -> None:
            self._cleanup(*(f.uri for f in (*files, *rejects)))

        if split.kill_switch.tripped:
            drop()
            return SplitKilled(split.kill_switch.reason or "killed")
        rows = sum(f.rows for f in files)
        counts, first = _reasons(rejects)
        errors = len(split) - rows
        if sum(counts.values()) != errors or set(counts) - set(PARSE_ERRORS):
            drop()
            return BuildError(f"split {split.id}: {rows} rows and {dict(counts)} rejected, the split has {len(split)}")
        if errors and spec.on_parse_error == "fail":
            drop()
            assert first is not None
            return ParseFailure(split.tp.topic, split.tp.partition, first[0], first[1])
        keep_rejects = bool(errors) and spec.on_parse_error == "reject"
        if not keep_rejects:
            self._cleanup(*(f.uri for f in rejects))
        events = [(f.min_event_us, f.max_event_us) for f in files if f.min_event_us is not None]
        return BuiltSegment(
            split_id=split.id,
            location=data_dir,
            files=tuple(f.uri for f in files),
            row_count=rows,
            size_bytes=sum(f.size_bytes for f in files) + (sum(f.size_bytes for f in rejects) if keep_rejects else 0),
            min_event_time=_utc(min(e[0] for e in events if e[0] is not None)) if events else None,
            max_event_time=_utc(max(e[1] for e in events if e[1] is not None)) if events else None,
            rejects_location=rejects_dir if keep_rejects else None,
            rejects_files=tuple(f.uri for f in rejects) if keep_rejects else (),
            rejects_count=errors if keep_rejects else 0,
            skipped_count=errors if spec.on_parse_error == "skip" else 0,
            parse_errors=tuple((reason, counts[reason]) for reason in PARSE_ERRORS if counts.get(reason)),
        )

    @staticmethod
    def _cleanup(*uris: str) -> None:
        for uri in uris:
            try:
                segment_store.delete(uri)
            except (OSError, segment_store.UnsafePath) as exc:
                log.warning("cleanup_failed", uri=uri, error=str(exc))


def _reasons(rejects: list[output_files.OutputFile]) -> tuple[dict[str, int], tuple[int, str] | None]:
    """Rejected records by reason, and the first one (offset, reason)."""
    if not rejects:
        return {}, None
    tables = []
    for f in rejects:
        fs, path = segment_store.filesystem(f.uri)
        tables.append(pq.read_table(path, columns=["_offset", "_error"], filesystem=fs))
    table = pa.concat_tables(tables)
    counts = {str(row["values"]): int(row["counts"]) for row in pc.value_counts(table["_error"]).to_pylist()}
    at = pc.index(table["_offset"], pc.min(table["_offset"])).as_py()
    return counts, (int(table["_offset"][at].as_py()), str(table["_error"][at].as_py()))


def _is_spark_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("pyspark", "py4j"))
