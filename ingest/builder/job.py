"""Spark turns a batch of sealed splits into Parquet files that stay invisible until published.

One Spark job per batch reads every split's exact offsets from Kafka (ingest.builder.kafka_read:
one task per split), parses the values against the source's schema (ingest.builder.plan) and
writes the good rows as zstd Parquet; the output files are told apart by their footers
(ingest.segments.output_files) and stay where Spark wrote them: each split's segment lists its
own files. Records that failed to parse are written by a second job, over the splits that have
any, only when the policy keeps them. A job's fixed cost (planning; on a young JVM, compiling
the planner's code) is paid once per batch, not per split.

Invariants, per build: its directories and splits are registered in the metastore before
anything is written (ingest.builder.registration); per split: every offset Spark read lies in
its range ``[start, end)``, and every record it read is a row of its files, a reject or a
skipped record (ingest.builder.accounting), anything else is a BuildError; the offsets of its
range that hold no record are its segment's ``holes``. Every failure deletes what the build
wrote. One split's failure (killed, bad input under ``fail``, a schema id the registry has not
served yet) does not fail the others of its batch; a split that read outside its range (or more
records than its offsets) fails its batch (the build queue retries each split alone). A build
that runs past its deadline is interrupted and fails (it is retried).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from ingest.builder.accounting import Observed, SplitStats, check_counts, check_ranges
from ingest.builder.kafka_read import SPLIT_COLUMN, KafkaReader
from ingest.builder.plan import FILE_PARTITION_COLUMN, META_COLUMNS, Plan, PlanCache, Writers
from ingest.builder.registration import BuildRegistrar
from ingest.builder.writer_schemas import (
    RegistryUnavailable,
    SchemaIdsPending,
    WriterSchemas,
    resolvable,
)
from ingest.errors import BuildError, ParseFailure, SplitKilled, WorkerFailed
from ingest.segments import output_files
from ingest.segments import store as segment_store
from ingest.spark.session import FixedSession, JobInterrupts, SessionSource, job_tag
from ingest.spec.model import SourceSpec
from ingest.splits.split import SealedSplit
from ingest_common.errors import cause_line
from ingest_common.model import PARSE_ERRORS, BuildRegistration, BuiltSegment

log = structlog.get_logger(__name__)

# Fail if the split's directory exists (split ids are fresh). "error", not its alias
# "errorifexists": the Spark Connect client only knows the short name.
WRITE_MODE = "error"

#: The largest dictionary a segment's column keeps (parquet-mr's default is 1 MiB). A column
#: whose distinct values outgrow it is written plain from there on: with the default, every value
#: of a split's high-cardinality columns (offsets, ids, timestamps, session strings) was hashed
#: into a dictionary the writer dropped when the file closed, ~30 % of the build's JVM CPU at
#: 100k-record batches (docs/benchmarks-notebook.md, "Parquet dictionaries"). Columns of few values (a
#: country, a device, the topic) keep theirs, and zstd sees to the rest: file sizes were within
#: 1 %. Compaction writes with the default: the files it leaves are the ones read for long.
DICTIONARY_PAGE_BYTES = 32 * 1024

#: How long one batch's build may run before it is interrupted and failed (retried).
BUILD_DEADLINE_S = 600.0
# A build runs again at once after it learned writer schemas it did not have, at most this often.
_MAX_SCHEMA_RERUNS = 2

# What building one split of a batch gave: its segment, or why there is none (SplitKilled,
# ParseFailure under policy "fail", BuildError; RegistryUnavailable, a BuildError: not built
# yet, the schema registry has not served one of its writer schema ids).
BuildResult = BuiltSegment | Exception


class SegmentBuilder(Protocol):
    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuildResult]:
        """One result per split, in order. Raises nothing for a split's own failure (a
        WorkerFailed, as the result of every split, ends the worker)."""
        ...


# How a worker makes its builder: given the registrar every build registers with first, and
# the reader of its Kafka (the worker's brokers and client settings).
BuilderFactory = Callable[[BuildRegistrar, KafkaReader], SegmentBuilder]


def _utc(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1_000_000, tz=UTC)


class SparkSegmentBuilder:
    """Safe to call from several threads with one SparkSession (jobs are tagged per batch).
    ``spark``: a session, or the SessionSource that owns it (each batch takes the current
    session and reports its failure there: a Connect session the server lost is replaced)."""

    def __init__(
        self,
        spark: Any,
        registrar: BuildRegistrar,
        reader: KafkaReader,
        *,
        writer_schemas: WriterSchemas | None = None,
        deadline_s: float = BUILD_DEADLINE_S,
        dictionary_page_bytes: int = DICTIONARY_PAGE_BYTES,
    ) -> None:
        self._sessions = spark if isinstance(spark, SessionSource) else FixedSession(spark)
        self._reader = reader
        self._deadline_s = deadline_s
        self._dictionary_page_bytes = dictionary_page_bytes
        self._interrupts = JobInterrupts(self._sessions)
        self._registrar = registrar
        self._plans = PlanCache()
        self.writer_schemas = writer_schemas or WriterSchemas()

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
        if live:
            results.update(self._build_live(live, spec))
        elapsed = time.monotonic() - started
        log.debug("batch_built", splits=len(splits), seconds=round(elapsed, 3))
        return [
            replace(r, build_seconds=elapsed) if isinstance(r, BuiltSegment) else r
            for r in (results[split.id] for split in splits)
        ]

    # -- internals -----------------------------------------------------------------

    def _build_live(self, splits: list[SealedSplit], spec: SourceSpec) -> dict[uuid.UUID, BuildResult]:
        build = uuid.uuid4()
        dirs = segment_store.build_dirs(spec.segment_store, spec.name, build)
        tag = f"ingest-batch-{build}"
        self._interrupt_when_all_killed(splits, tag)
        registered = False
        spark: Any = None
        timed_out = threading.Event()

        def past_deadline() -> None:
            timed_out.set()
            log.error("build_past_deadline", batch=str(build), splits=len(splits), deadline_s=self._deadline_s)
            self._interrupts.request(tag)

        deadline = threading.Timer(self._deadline_s, past_deadline)
        deadline.daemon = True
        try:
            spark = self._sessions.current()
            self._registrar.register(
                BuildRegistration(
                    build, spec.name, dirs.staging, dirs.data, dirs.rejects, tuple(split.id for split in splits)
                ),
                splits,
            )
            registered = True
            if all(split.kill_switch.tripped for split in splits):
                raise SplitKilled("killed")
            with job_tag(spark, tag):
                deadline.start()
                return self._run(spark, splits, spec, dirs.data, dirs.rejects)
        except Exception as exc:
            if spark is not None:
                self._sessions.failed(spark, exc)
            if registered:
                segment_store.delete_files(dirs.data, dirs.rejects)
            if isinstance(exc, WorkerFailed):
                # No build can run in this process again (SparkDriverExited), or none should
                # (RegistryMisconfigured): not one to retry.
                return {split.id: exc for split in splits}
            if isinstance(exc, RegistryUnavailable):
                return {split.id: exc for split in splits}
            killed = all(split.kill_switch.tripped for split in splits)
            if not isinstance(exc, BuildError | SplitKilled) and not killed:
                log.warning(
                    "batch_failed",
                    batch=str(build),
                    splits=len(splits),
                    timed_out=timed_out.is_set(),
                    error=cause_line(exc),
                    exc_info=not _is_spark_error(exc),
                )
            cause = (
                f"it ran past its deadline of {self._deadline_s:g} s (INGEST_BUILD_DEADLINE_S) and was interrupted"
                if timed_out.is_set()
                else cause_line(exc)
            )
            failed: dict[uuid.UUID, BuildResult] = {}
            for split in splits:
                if split.kill_switch.tripped:
                    failed[split.id] = SplitKilled(split.kill_switch.reason or "killed")
                else:
                    failed[split.id] = BuildError(
                        f"building split {split.id} of {split.tp} (batch of {len(splits)}) failed: {cause}"
                    )
            return failed
        finally:
            deadline.cancel()

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

    def _writers(self, spec: SourceSpec) -> Writers:
        """Every writer this worker knows for the spec's registry; the Avro value writers
        checked against the reader schema (one it cannot resolve is left out of the job: its
        records are rejects, a from_avro it cannot resolve would fail the job)."""
        if spec.registry is None:
            return Writers()
        avro = self.writer_schemas.avro(spec.registry) if "avro" in (spec.format, spec.key_format) else {}
        values, unresolvable = resolvable(spec, avro) if spec.format == "avro" else ({}, frozenset())
        protobuf = self.writer_schemas.protobuf(spec.registry) if spec.format == "protobuf" else {}
        keys = {sid: w for sid, w in avro.items() if w} if spec.key_format == "avro" else {}
        return Writers(values, unresolvable, keys, protobuf)

    def _run(
        self, spark: Any, splits: list[SealedSplit], spec: SourceSpec, data_dir: str, rejects_dir: str
    ) -> dict[uuid.UUID, BuildResult]:
        """The good rows' job (again, after it learned writer schemas it lacked), then the rejects'."""
        for rerun in range(_MAX_SCHEMA_RERUNS + 1):
            plan = self._plans.get(spec, self._writers(spec))
            total, stats = self._write(spark, plan, splits, spec, good=True, out_dir=data_dir)
            # Before the files are attributed: a record read outside its split's range is
            # named as such, not as a file that lies in no split.
            check_ranges(splits, stats)
            if spec.registry is None or rerun == _MAX_SCHEMA_RERUNS or not self._learned(spec, list(stats.values())):
                break
            # New writers: their records were read as unknown ids; read them again with them.
            segment_store.delete_files(data_dir)
        data = output_files.attribute(data_dir, splits, spec.event_time)
        check_counts(splits, total, stats, {split.id: sum(f.rows for f in data[split.id]) for split in splits})
        waiting = _waiting(self.writer_schemas, spec, splits, stats)
        for split_id in waiting:
            segment_store.delete_files(*(f.uri for f in data[split_id]))
        ready = [s for s in splits if s.id not in waiting]
        rejected: dict[uuid.UUID, list[output_files.OutputFile]] = {split.id: [] for split in ready}
        short = [s for s in ready if stats[s.id].bad and not s.kill_switch.tripped]
        if short and spec.on_parse_error == "reject":
            _, again = self._write(spark, plan, short, spec, good=False, out_dir=rejects_dir)
            check_ranges(short, again)
            if any(again[s.id].bad != stats[s.id].bad for s in short):
                raise BuildError("the rejects job read other bad records than the first job")
            rejected.update(output_files.attribute(rejects_dir, short))
        results: dict[uuid.UUID, BuildResult] = dict(waiting)
        for split in ready:
            results[split.id] = self._finish(
                split, spec, stats[split.id], data[split.id], rejected[split.id], data_dir, rejects_dir
            )
        return results

    def _write(
        self, spark: Any, plan: Plan, splits: list[SealedSplit], spec: SourceSpec, *, good: bool, out_dir: str
    ) -> tuple[int, dict[uuid.UUID, SplitStats]]:
        """One Spark job: read the splits, parse, write the good (or the bad) rows to
        ``out_dir``. Returns the records it read and what it observed per split."""
        from pyspark.sql import Observation

        # In one order for every batch of the same partitions: a job's expressions are then
        # the previous job's, and Spark reuses their compiled code.
        splits = sorted(splits, key=lambda s: (s.tp, s.start))
        df = self._reader.frame(spark, splits)
        if plan.decode is not None:
            df = plan.decode(df)
        observed = Observed(splits, plan, first_bad=good and spec.on_parse_error == "fail")
        df = df.select(*plan.read_columns, SPLIT_COLUMN).withColumn("_error", plan.error)
        observation = Observation(f"build-{uuid.uuid4().hex}")
        rows = df.observe(observation, *observed.expressions()).filter(plan.good if good else ~plan.good)
        if good and plan.file_partition is not None:
            # One file per (task, value): a task reads one split, so a file stays within one
            # split (ingest.segments.output_files), and within one partition value too.
            rows = rows.select(*plan.output_columns, plan.file_partition.alias(FILE_PARTITION_COLUMN))
            writer = rows.write.partitionBy(FILE_PARTITION_COLUMN)
        else:
            columns = plan.output_columns if good else (*META_COLUMNS, "_value", "_error")
            writer = rows.select(*columns).write
        if good:
            writer = writer.option("parquet.dictionary.page.size", str(self._dictionary_page_bytes))
        writer.mode(WRITE_MODE).option("compression", "zstd").parquet(out_dir)
        return observed.read(observation.get)

    def _learned(self, spec: SourceSpec, stats: Sequence[SplitStats]) -> bool:
        """Fetch the ids the job met that no writer had; whether any of them was served now."""
        assert spec.registry is not None
        values = set().union(*(s.unknown_ids for s in stats))
        keys = set().union(*(s.unknown_key_ids for s in stats))
        learned = False
        if values:
            fetched = self.writer_schemas.fetch(spec.registry, values, protobuf=spec.format == "protobuf")
            learned = bool(fetched.learned)
        if keys:
            learned = bool(self.writer_schemas.fetch(spec.registry, keys).learned) or learned
        return learned

    def _finish(
        self,
        split: SealedSplit,
        spec: SourceSpec,
        stats: SplitStats,
        files: list[output_files.OutputFile],
        rejects: list[output_files.OutputFile],
        data_dir: str,
        rejects_dir: str,
    ) -> BuildResult:
        """Apply the parse-error policy to one split of the batch: its segment lists its
        files where Spark wrote them, or they are deleted."""

        def drop() -> None:
            segment_store.delete_files(*(f.uri for f in (*files, *rejects)))

        if split.kill_switch.tripped:
            drop()
            return SplitKilled(split.kill_switch.reason or "killed")
        rows = sum(f.rows for f in files)
        errors = stats.bad
        if errors and spec.on_parse_error == "fail":
            drop()
            assert stats.first_bad is not None
            return ParseFailure(split.tp.topic, split.tp.partition, *stats.first_bad)
        counts: dict[str, int] = {}
        if errors and spec.on_parse_error == "reject":
            counts = _reasons(rejects)
            if sum(counts.values()) != errors or set(counts) - set(PARSE_ERRORS):
                drop()
                return BuildError(f"split {split.id}: {errors} bad records read, rejects files hold {counts}")
        keep_rejects = bool(errors) and spec.on_parse_error == "reject"
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
            record_bytes=stats.record_bytes,
            last_timestamp_ms=stats.last_timestamp_ms,
            holes=split.offsets - rows - errors,
        )


def _waiting(
    schemas: WriterSchemas, spec: SourceSpec, splits: list[SealedSplit], stats: dict[uuid.UUID, SplitStats]
) -> dict[uuid.UUID, BuildResult]:
    """The splits holding ids the registry has not served, whose wait has not passed (a
    404 within its wait, or no answer), and those holding ids served only since the last
    job ran without them (the registry answered 404 to this build and serves them now, or
    another build learned them): not built yet (the build queue builds them again). Only
    ids answered 404 past their wait are left as the job's ``unknown_schema_id`` rejects."""
    if spec.registry is None:
        return {}
    protobuf = spec.format == "protobuf"
    out: dict[uuid.UUID, BuildResult] = {}
    for split in splits:
        s = stats[split.id]
        if not (s.unknown_ids or s.unknown_key_ids):
            continue
        fetched = schemas.fetch(spec.registry, s.unknown_ids, protobuf=protobuf)
        keys = schemas.fetch(spec.registry, s.unknown_key_ids)
        # Ids the job met with no writer that have one now (a key's id of another type stays a reject).
        served = schemas.protobuf(spec.registry) if protobuf else schemas.avro(spec.registry)
        served_keys = schemas.avro(spec.registry)
        late = {i for i in s.unknown_ids if i in served} | {i for i in s.unknown_key_ids if served_keys.get(i)}
        if fetched.failure or keys.failure:
            out[split.id] = fetched.failure or keys.failure or RegistryUnavailable("no answer")
        elif fetched.pending or keys.pending:
            ids = ", ".join(map(str, sorted(fetched.pending | keys.pending)))
            out[split.id] = SchemaIdsPending(
                f"schema registry {spec.registry.url} does not know schema id(s) {ids} yet (404):"
                " waiting for them (INGEST_SCHEMA_ID_WAIT_S) before their records are rejects"
            )
        elif late:
            ids = ", ".join(map(str, sorted(late)))
            out[split.id] = SchemaIdsPending(
                f"schema registry {spec.registry.url} served schema id(s) {ids} only after the job that met"
                " them ran: built again with them"
            )
    return out


def _reasons(rejects: list[output_files.OutputFile]) -> dict[str, int]:
    """Rejected records by reason."""
    if not rejects:
        return {}
    tables = []
    for f in rejects:
        fs, path = segment_store.filesystem(f.uri)
        tables.append(pq.read_table(path, columns=["_error"], filesystem=fs))
    table = pa.concat_tables(tables)
    return {str(row["values"]): int(row["counts"]) for row in pc.value_counts(table["_error"]).to_pylist()}


def _is_spark_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("pyspark", "py4j"))
