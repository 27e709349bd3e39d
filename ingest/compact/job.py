"""One compaction: each chosen chunk (ingest.compact.plan) rewritten by one Spark job into
files near the target size, checked, then replaced in one metastore transaction.

Per chunk, in this order, as a worker's build does:

1. A build of one split (the new segment's) is registered in the metastore before anything is
   written (``ingest.builder.registration``'s rule): a compaction that dies from here on leaves
   files nobody lists, and gc abandons its split and sweeps them after the grace period.
2. One Spark job reads the old segments' data files and writes them as zstd Parquet into the
   build's data directory: one task, so one file per value of the cut (the chunk is at most
   the target size), sorted by ``_partition, _offset`` within a file; the cut: the finest of
   the old files' spec version's ``file_partition``, the latest spec's and the Iceberg data
   table's partition transform (``ingest.compact.plan.file_cut``).
3. The job's row count and the new files' footers are checked like a build's
   (``ingest.segments.output_files``): every file of the chunk's partition, its offsets inside the
   chunk's range, the rows adding up to the old segments' rows.
4. ``Metastore.replace_segments`` replaces the old segments by the new one, or refuses (another
   compactor was first, gc gave the split up, ...): then the new files are deleted.

Nothing here touches offsets: the new segment covers exactly the old ones' ranges, and the
metastore checks that again under its locks.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow.parquet as pq
import structlog

from ingest.builder.plan import FILE_PARTITION_COLUMN, file_partition_value
from ingest.compact.plan import Chunk, choose, file_cut
from ingest.errors import BuildError
from ingest.segments import output_files
from ingest.segments import store as segment_store
from ingest.spark.session import JobInterrupts, SessionSource, job_tag
from ingest.spec.model import SourceSpec
from ingest_common.backoff import Backoff
from ingest_common.model import BuildRegistration, PartitionBy, TopicPartition
from metastore.base import Row
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable, ReplaceRefused, Session

log = structlog.get_logger(__name__)

# An unknown outcome (or an outage) is resolved by ending the old session and replacing again
# (idempotent by split id): this many attempts, these far apart.
REPLACE_BACKOFF = Backoff(initial_s=0.5, max_s=10.0)
REPLACE_ATTEMPTS = 8
# Fault injection for tests: "rewritten" logs `compaction_fault_pause` once a chunk's files are
# written and checked, before its replacement, and waits there until the process is killed.
FAULT_PAUSE_ENV = "INGEST_FAULT_COMPACT_PAUSE_AT"


class CompactionStore(Protocol):
    """The part of ``metastore.Metastore`` a compaction needs."""

    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]: ...

    def spec_versions(self, name: str) -> list[Row]: ...

    def segments(self, source: str) -> list[Row]: ...

    def table_partition(self, source: str) -> PartitionBy | None: ...

    def register_build(self, worker: str, build: BuildRegistration) -> None: ...

    def end_session(self, session: Session) -> bool: ...

    def replace_segments(
        self,
        source: str,
        split_id: uuid.UUID,
        worker: str,
        old_ids: list[int],
        location: str,
        files: list[str],
        row_count: int,
        size_bytes: int,
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class _NewSegment:
    """What the new files are attributed to (``output_files.Bounds``)."""

    id: uuid.UUID
    tp: TopicPartition
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Replacement:
    """One chunk compacted: the new segment and what it replaced."""

    segment_id: int
    replaced: tuple[int, ...]
    tp: TopicPartition
    start: int
    end: int
    rows: int
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    seconds: float


@dataclass(slots=True)
class CompactionResult:
    source: str
    target_bytes: int
    chosen: list[Chunk] = field(default_factory=list)
    replaced: list[Replacement] = field(default_factory=list)
    # Chunks whose replacement the metastore refused: (old segment ids, reason, detail).
    refused: list[tuple[tuple[int, ...], str, str]] = field(default_factory=list)


class Compactor:
    """Compacts one source at a time with one Spark session, from the one owner of it that
    ``sessions`` makes on first need (ingest.spark.start.session_source: under Spark Connect a
    session the server lost is replaced by the next job). A run can be asked to stop from
    another thread (:meth:`interrupt`): its running Spark job is interrupted (each job is
    tagged) and no other chunk starts."""

    def __init__(self, store: CompactionStore, sessions: Callable[[SourceSpec], SessionSource], worker_id: str) -> None:
        self._store = store
        self._session_factory = sessions
        self._sessions: SessionSource | None = None
        self._interrupts: JobInterrupts | None = None
        self._worker = worker_id
        # The tag of the Spark job running now, and whether the run was asked to stop: read
        # and written under the lock, so an interrupt never misses a job that starts.
        self._lock = threading.Lock()
        self._job_tag: str | None = None
        self._interrupted = False

    def plan(self, source: str, target_bytes: int | None = None) -> tuple[SourceSpec, list[Chunk]]:
        """The source's latest spec and the chunks worth compacting now."""
        spec = SourceSpec.from_json(self._store.latest_spec(source)[1])
        target = target_bytes or spec.compaction.target_file_bytes
        return spec, choose(self._store.segments(source), target)

    def survey(self, source: str, target_bytes: int | None = None) -> tuple[list[Row], list[Chunk]]:
        """The source's current segments and the chunks worth compacting among them (metrics)."""
        spec = SourceSpec.from_json(self._store.latest_spec(source)[1])
        segments = self._store.segments(source)
        return segments, choose(segments, target_bytes or spec.compaction.target_file_bytes)

    def run(
        self,
        source: str,
        target_bytes: int | None = None,
        max_chunks: int | None = None,
        dry_run: bool = False,
        progress: Callable[[], None] = lambda: None,
    ) -> CompactionResult:
        """``progress``: called after each chunk (replaced or refused): a step of the run ended."""
        with self._lock:
            self._interrupted = False
        spec, chunks = self.plan(source, target_bytes)
        result = CompactionResult(source, target_bytes or spec.compaction.target_file_bytes, chunks[:max_chunks])
        if dry_run:
            return result
        specs = {int(v["version"]): SourceSpec.from_json(v["spec"]) for v in self._store.spec_versions(source)}
        for chunk in result.chosen:
            try:
                result.replaced.append(self.compact(spec, specs[chunk.spec_version], chunk))
            except ReplaceRefused as exc:
                result.refused.append((chunk.ids, exc.reason, exc.detail))
            progress()
        return result

    def interrupt(self) -> None:
        """Stop the run in progress: its Spark job is interrupted (the chunk fails, its files are
        deleted) and no other job of it starts. Never blocks (ingest.spark.session.JobInterrupts)."""
        with self._lock:
            self._interrupted = True
            tag, interrupts = self._job_tag, self._interrupts
        if tag is not None and interrupts is not None:
            interrupts.request(tag)

    def compact(self, spec: SourceSpec, written_under: SourceSpec, chunk: Chunk) -> Replacement:
        """Rewrite one chunk and replace its segments. ``spec``: the source's latest spec (where
        to write); ``written_under``: the spec version the chunk's files were written under
        (their event-time column and file cut). Raises ReplaceRefused when the metastore refused
        (the new files are deleted then)."""
        started = time.monotonic()
        cut = file_cut(written_under.file_partition, spec.file_partition, self._store.table_partition(spec.name))
        split_id, build = uuid.uuid4(), uuid.uuid4()
        dirs = segment_store.build_dirs(spec.segment_store, spec.name, build)
        self._store.register_build(
            self._worker, BuildRegistration(build, spec.name, dirs.staging, dirs.data, dirs.rejects, (split_id,))
        )
        log.info("compaction_registered", source=spec.name, build=str(build), segments=len(chunk.segments))
        unknown = False
        try:
            new_files = self._rewrite(written_under, cut, chunk, split_id, dirs.data) if chunk.files else []
            size = sum(f.size_bytes for f in new_files) + _sizes(chunk)
            uris = [f.uri for f in new_files]
            if os.environ.get(FAULT_PAUSE_ENV) == "rewritten":
                log.warning("compaction_fault_pause", source=spec.name, build=str(build), files=len(uris))
                while True:
                    time.sleep(1)
            try:
                segment_id = self._replace(spec.name, split_id, chunk, dirs.data, uris, size)
            except (CommitOutcomeUnknown, MetastoreUnavailable):
                unknown = True  # it may have committed: its files are gc's to judge
                raise
        except ReplaceRefused as exc:
            log.warning("compaction_refused", source=spec.name, segments=list(chunk.ids), reason=exc.reason)
            _cleanup(dirs.data)
            raise
        except Exception:
            if not unknown:
                _cleanup(dirs.data)
            raise
        done = Replacement(
            segment_id=segment_id,
            replaced=chunk.ids,
            tp=chunk.tp,
            start=chunk.start,
            end=chunk.end,
            rows=chunk.rows,
            files_before=len(chunk.files),
            bytes_before=chunk.size_bytes,
            files_after=len(uris),
            bytes_after=size,
            seconds=time.monotonic() - started,
        )
        log.info(
            "compaction_replaced",
            source=spec.name,
            segment=segment_id,
            replaced=len(done.replaced),
            files_before=done.files_before,
            files_after=done.files_after,
            seconds=round(done.seconds, 3),
        )
        return done

    def _rewrite(
        self, spec: SourceSpec, cut: PartitionBy, chunk: Chunk, split_id: uuid.UUID, out_dir: str
    ) -> list[output_files.OutputFile]:
        if self._sessions is None:
            self._sessions = self._session_factory(spec)
            self._interrupts = JobInterrupts(self._sessions)
        spark = self._sessions.current()
        # The files' own column order (all were written under one spec version).
        fs, path = segment_store.filesystem(chunk.files[0])
        columns = pq.read_schema(path, filesystem=fs).names
        tag = f"ingest-compact-{split_id.hex}"
        with contextlib.ExitStack() as tagged:
            try:
                with self._lock:
                    if self._interrupted:
                        raise BuildError("compaction interrupted before its Spark job started")
                    # Set before an interrupt can name it: the jobs of this thread carry it.
                    tagged.enter_context(job_tag(spark, tag))
                    self._job_tag = tag
                return self._spark_rewrite(spark, spec, cut, chunk, split_id, out_dir, columns)
            except Exception as exc:
                self._sessions.failed(spark, exc)
                raise
            finally:
                with self._lock:
                    self._job_tag = None

    def stop(self) -> None:
        """Release the session (a Connect server's side of it too)."""
        if self._sessions is not None:
            self._sessions.stop()

    def _spark_rewrite(
        self,
        spark: Any,
        spec: SourceSpec,
        cut_by: PartitionBy,
        chunk: Chunk,
        split_id: uuid.UUID,
        out_dir: str,
        columns: list[str],
    ) -> list[output_files.OutputFile]:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        observation = Observation(f"compact-{split_id.hex}")
        df = spark.read.parquet(*chunk.files).select(*columns)
        df = df.observe(observation, F.count(F.lit(1)).alias("total")).coalesce(1)
        cut = file_partition_value(F.col(spec.event_time), cut_by)
        if cut is None:
            writer = df.sortWithinPartitions("_partition", "_offset").write
        else:
            df = df.withColumn(FILE_PARTITION_COLUMN, cut)
            writer = df.sortWithinPartitions(FILE_PARTITION_COLUMN, "_partition", "_offset").write
            writer = writer.partitionBy(FILE_PARTITION_COLUMN)
        writer.mode("error").option("compression", "zstd").parquet(out_dir)
        total = int(observation.get["total"])
        if total != chunk.rows:
            raise BuildError(f"compaction read {total} rows, the {len(chunk.segments)} segments hold {chunk.rows}")
        bounds = _NewSegment(split_id, chunk.tp, chunk.start, chunk.end)
        files = output_files.attribute(out_dir, [bounds], spec.event_time)[split_id]
        if (rows := sum(f.rows for f in files)) != chunk.rows:
            raise BuildError(f"compaction wrote {rows} rows, the {len(chunk.segments)} segments hold {chunk.rows}")
        return files

    def _replace(
        self, source: str, split_id: uuid.UUID, chunk: Chunk, location: str, files: list[str], size: int
    ) -> int:
        delays = REPLACE_BACKOFF.delays()
        for attempt in range(1, REPLACE_ATTEMPTS + 1):
            try:
                return self._store.replace_segments(
                    source, split_id, self._worker, list(chunk.ids), location, files, chunk.rows, size
                )
            except MetastoreUnavailable as exc:
                if attempt == REPLACE_ATTEMPTS:
                    raise
                delay = next(delays)
                log.warning("compaction_replace_retry", source=source, error=str(exc), retry_in_s=delay)
                REPLACE_BACKOFF.sleep(delay)
                session = exc.session if isinstance(exc, CommitOutcomeUnknown) else None
                # The old session may still commit: it is ended before the replacement is sent
                # again (which then answers with the segment if it did).
                for _ in range(REPLACE_ATTEMPTS):
                    if session is None or self._end(session):
                        break
                    REPLACE_BACKOFF.sleep(next(delays))
                else:
                    raise
        raise AssertionError("unreachable")

    def _end(self, session: Session) -> bool:
        try:
            return self._store.end_session(session)
        except MetastoreUnavailable:
            return False


def spark_failure(exc: BaseException) -> bool:
    """An exception raised by Spark (PySpark, Spark Connect's client, Py4J)."""
    return type(exc).__module__.startswith(("pyspark", "py4j"))


def _sizes(chunk: Chunk) -> int:
    """The bytes of the rejects files the new segment carries as they are."""
    total = 0
    for seg in chunk.segments:
        for uri in seg.rejects_files:
            fs, path = segment_store.filesystem(uri)
            total += int(fs.get_file_info(path).size or 0)
    return total


def _cleanup(uri: str) -> None:
    try:
        segment_store.delete(uri)
    except (OSError, segment_store.UnsafePath) as exc:
        log.warning("cleanup_failed", uri=uri, error=str(exc))
