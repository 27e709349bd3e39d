"""The committer of an upsert table (a spec's ``[table] mode = "upsert"``): the source's data
table is the current state per key, every published segment's changes merged into it once, in
Kafka's order within a partition. The segments stay the append-only log they are; the rejects
table stays an append table (ingest.table.committer).

Invariants (docs/iceberg.md, "Upsert tables"):

- The table's progress is, per partition, the next offset whose change is not merged yet
  (``ingest.upsert-offsets`` in the table's properties, ``upsert_offsets`` in the metastore),
  with the commit seq (``ingest.commit-seq``) beside it. A batch is, per partition, the rows of
  the current segments from that offset on: a compaction that replaced merged and unmerged
  segments by one changes nothing of it, and no offset is merged twice or skipped.
- Commit ``seq`` is staged on a branch of its own, created at the head ``S`` of ``main`` the
  batch was chosen from (a table at ``seq - 1``): Spark's ``MERGE INTO`` writes the batch's
  changes there (ingest.table.merge). It becomes the table only through one catalog swap that
  asserts ``main`` is still ``S`` and sets, together, ``main`` to the branch's head, the commit
  seq and the offsets: a committer frozen anywhere before the swap (a zombie) is refused once
  anything moved ``main`` — another commit or the maintenance — and retries from the reconcile.
  A branch head whose parent is not ``S`` is never swapped in.
- In the metastore's catalog the commit is recorded in the swap's transaction
  (metastore.upserts.fence_upsert); in another catalog right after it, and a crash between the
  two leaves the table one commit ahead, which the reconcile records from its properties.
- The table owns its files (``gc.enabled=true``): a merge copies rows, registers no segment
  file, so ``ingest gc`` and the table's own expiry never touch each other's files.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
import structlog
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotRefUpdate, SetSnapshotRefUpdate, TableUpdate

from ingest.spec.model import SourceSpec
from ingest.spec.table import OP_COLUMN
from ingest.table.catalog import MetastoreCatalog, identifier, table_location
from ingest.table.config import CommitSettings, PartitionBy
from ingest.table.errors import CommitConflicts, MergeFailed, SchemaChangeRefused, TableDiverged, TableError
from ingest.table.faults import FaultPoint, pause_if
from ingest.table.merge import (
    MERGE_ON_READ,
    TABLE_PARTITION_COLUMN,
    RowRange,
    maintain,
    merge_batch,
    open_merge_session,
)
from ingest.table.metrics import TableMetrics
from ingest.table.properties import COMMIT_SEQ
from ingest.table.schema import file_schema, transform_of
from ingest.table.spark_catalog import spark_table_name
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line
from metastore.tables import StaleTableCommit, TableKind
from metastore.upserts import PendingRange, UpsertCommit, UpsertState, UpsertStore, fence_upsert

log = structlog.get_logger(__name__)

UPSERT_OFFSETS = "ingest.upsert-offsets"
CROSS_PARTITION_KEYS = "ingest.cross-partition-keys"
STAGE_PREFIX = "ingest_stage_"
CONFLICT_RETRY = Backoff(0.1, 2.0)
# Maintenance runs after a commit once the table has this many delete files.
MAINTAIN_AFTER_DELETE_FILES = 20


@dataclass(frozen=True, slots=True)
class UpsertResult:
    seq: int
    segment_ids: tuple[int, ...]
    keys: int
    cross_partition_keys: int
    seconds: float
    conflicts: int


def table_schema(first_file: str) -> pa.Schema:
    """An upsert table's columns: a segment file's, without ``_op`` and with the Kafka
    partition as ``_kafka_partition``."""
    schema = file_schema(first_file)
    fields = [
        f.with_name(TABLE_PARTITION_COLUMN) if f.name == "_partition" else f for f in schema if f.name != OP_COLUMN
    ]
    return pa.schema(fields)


def batch_of(pending: Sequence[PendingRange]) -> tuple[list[RowRange], dict[str, int], tuple[int, ...], list[str]]:
    """The batch ``pending`` makes: per partition one row range (its ranges follow each other),
    the offsets after it, its segment ids and files."""
    spans: dict[tuple[str, int], list[int]] = {}
    for r in pending:
        span = spans.setdefault((r.topic, r.partition), [r.start, r.end])
        if r.start > span[1]:
            # A skipped gap (retention, truncation) lies between: nothing of it is in the log.
            log.info("upsert_gap_in_batch", topic=r.topic, partition=r.partition, start=span[1], end=r.start)
        span[1] = max(span[1], r.end)
    ranges = [RowRange(t, p, s, e) for (t, p), (s, e) in sorted(spans.items())]
    offsets = {f"{r.topic}/{r.partition}": r.end for r in ranges}
    ids = tuple(sorted({r.segment_id for r in pending}))
    files = sorted({f for r in pending for f in r.files})
    return ranges, offsets, ids, files


@dataclass(frozen=True, slots=True)
class Staged:
    """A commit staged on its branch: the head it was built on, the branch's new head."""

    base_id: int
    snapshot_id: int
    branch: str
    keys: int
    cross_partition_keys: int


class UpsertCommitter:
    """One source's upsert table (kind ``data``), merged through ``spark`` (a classic session
    with Iceberg's runtime and the metastore's catalog, ingest.table.merge)."""

    def __init__(
        self,
        store: UpsertStore,
        catalog: Catalog,
        database_url: str,
        source: str,
        settings: CommitSettings,
        metrics: TableMetrics,
        spec: Callable[[], SourceSpec],
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.source = source
        self.settings = settings
        self.metrics = metrics
        self._spec = spec
        self._database_url = database_url
        self._spark: Any = None
        self._spark_owned = False
        self.kind = TableKind.DATA

    def spark(self) -> Any:
        """The merges' Spark session (ingest.table.merge.open_merge_session), started when first needed."""
        if self._spark is None:
            self._spark, self._spark_owned = open_merge_session(
                self._database_url, self.source, self._spec().segment_store
            )
        return self._spark

    def close(self) -> None:
        if self._spark is not None and self._spark_owned:
            self._spark.stop()
        self._spark = None

    @property
    def name(self) -> str:
        return ".".join(identifier(self.source, self.kind))

    def _load(self) -> Table | None:
        try:
            return self.catalog.load_table(identifier(self.source, self.kind))
        except NoSuchTableError:
            return None

    def _create(self, spec: SourceSpec, first_file: str, partition_by: PartitionBy) -> Table:
        """The table, with one empty snapshot (a branch needs a head to start from)."""
        ident = identifier(self.source, self.kind)
        self.catalog.create_namespace_if_not_exists(ident[0])
        properties = {
            **MERGE_ON_READ,
            # The table owns its files: merges write them, its expiry deletes them.
            "gc.enabled": "true",
            COMMIT_SEQ: "0",
            UPSERT_OFFSETS: "{}",
            CROSS_PARTITION_KEYS: "0",
            "ingest.source": self.source,
            "ingest.table": self.kind.value,
            "ingest.mode": "upsert",
        }
        location = (
            table_location(spec.segment_store, self.source, self.kind)
            if isinstance(self.catalog, MetastoreCatalog)
            else None
        )
        schema = table_schema(first_file)
        txn = self.catalog.create_table_transaction(ident, schema=schema, location=location, properties=properties)
        transform = transform_of(partition_by)
        if transform is not None:
            with txn.update_spec() as update:
                update.add_field(spec.event_time, transform, f"{spec.event_time}_{partition_by.value}")
        txn.append(schema.empty_table())
        table = txn.commit_transaction()
        log.info("upsert_table_created", source=self.source, location=table.location(), keys=list(spec.table.key))
        return table

    def reconcile(self, table: Table | None) -> UpsertState:
        """The metastore brought up to what the table holds (one commit ahead: recorded from the
        table's properties); any other difference stops the committer."""
        state = self.store.upsert_state(self.source, self.kind)
        if table is None:
            if state.seq:
                raise TableDiverged(
                    f"table {self.name} is gone from the catalog but the metastore recorded {state.seq} "
                    "commit(s) to it; nothing is merged until it is restored"
                )
            return state
        held = int(table.properties.get(COMMIT_SEQ, "0"))
        if held == state.seq:
            return state
        if held != state.seq + 1:
            raise TableDiverged(
                f"table {self.name} holds commit {held} but the metastore recorded {state.seq}: "
                "the table was changed outside the committer; nothing is merged"
            )
        offsets = {k: int(v) for k, v in json.loads(table.properties.get(UPSERT_OFFSETS, "{}")).items()}
        total = int(table.properties.get(CROSS_PARTITION_KEYS, "0"))
        snapshot = table.current_snapshot()
        commit = UpsertCommit(
            self.source,
            self.kind,
            held,
            offsets,
            max(total - state.cross_partition_keys, 0),
            snapshot.snapshot_id if snapshot else None,
            datetime.now(UTC),
        )
        self.store.record_upsert(commit)
        log.warning("table_commit_reconciled", source=self.source, table=self.kind.value, seq=held, mode="upsert")
        return self.store.upsert_state(self.source, self.kind)

    def commit_batch(self) -> UpsertResult | None:
        """One merge of the pending changes (None: none pending); a conflict is retried from
        the reconcile, at most ``max_attempts`` times."""
        conflicts = 0
        for _attempt in range(self.settings.max_attempts):
            started = time.monotonic()
            table = self._load()
            state = self.reconcile(table)
            pending = self.store.pending_ranges(self.source, state.offsets, self.settings.batch_segments)
            if not pending:
                return None
            ranges, advanced, ids, files = batch_of(pending)
            spec = self._spec()
            try:
                if table is None:
                    partition_by = PartitionBy(self.store.table(self.source, self.kind).partition_by)
                    table = self._create(spec, files[0], partition_by)
                    continue  # reconciled from the new table's state
                self._evolve(table, files)
                seq = state.seq + 1
                result = self._merge(table, seq, files, ranges, spec.table.key)
                offsets = {**state.offsets, **advanced}
                cross_total = state.cross_partition_keys + result.cross_partition_keys
                commit = UpsertCommit(
                    self.source,
                    self.kind,
                    seq,
                    offsets,
                    result.cross_partition_keys,
                    result.snapshot_id,
                    datetime.now(UTC),
                    ids,
                )
                self._swap(result.base_id, result.snapshot_id, result.branch, commit, cross_total)
            except (CommitFailedException, TableAlreadyExistsError, StaleTableCommit) as exc:
                conflicts += 1
                self.metrics.commit_conflicts.labels(self.source, self.kind.value).inc()
                log.warning("table_commit_conflict", source=self.source, table=self.kind.value, error=first_line(exc))
                CONFLICT_RETRY.sleep(CONFLICT_RETRY.delay(conflicts - 1))
                continue
            seconds = time.monotonic() - started
            self.metrics.commit_seconds.labels(self.source, self.kind.value).observe(seconds)
            self.metrics.commits.labels(self.source, self.kind.value).inc()
            self.metrics.segments_committed.labels(self.source, self.kind.value).inc(len(ids))
            log.info(
                "table_committed",
                source=self.source,
                table=self.kind.value,
                mode="upsert",
                seq=seq,
                segments=len(ids),
                keys=result.keys,
                cross_partition_keys=result.cross_partition_keys,
                seconds=round(seconds, 4),
            )
            return UpsertResult(seq, ids, result.keys, result.cross_partition_keys, seconds, conflicts)
        raise CommitConflicts(
            f"table {self.name}: {conflicts} commit conflicts in a row; another process keeps changing it"
        )

    def _evolve(self, table: Table, files: Sequence[str]) -> None:
        """Columns a newer spec version added become the table's (before the branch is made:
        a branch has the table's schema)."""
        for uri in {files[0], files[-1]}:
            schema = table_schema(uri)
            if all(name in table.schema().column_names for name in schema.names):
                continue
            try:
                with table.update_schema() as update:
                    update.union_by_name(schema)
            except Exception as exc:  # pyiceberg raises ValidationError, ValueError or ResolveError
                raise SchemaChangeRefused(f"table {self.name}: {first_line(exc)}") from exc

    def _merge(
        self, table: Table, seq: int, files: Sequence[str], ranges: Sequence[RowRange], keys: Sequence[str]
    ) -> Staged:
        """Stage commit ``seq`` on a branch of its own at the head of ``main``."""
        head = table.current_snapshot()
        if head is None:
            raise TableError(f"table {self.name} has no snapshot to merge onto")
        branch = f"{STAGE_PREFIX}{seq}_{uuid.uuid4().hex[:8]}"
        manage = table.manage_snapshots()
        # Branches of attempts that never reached their swap (a crash, a conflict) would keep
        # their snapshots, and files, from expiring. A committer still using one is refused at its
        # swap all the same (main moves with this commit).
        for stale in sorted(name for name in table.metadata.refs if name.startswith(STAGE_PREFIX)):
            manage = manage.remove_branch(stale)
        manage.create_branch(head.snapshot_id, branch).commit()
        try:
            result = merge_batch(self.spark(), spark_table_name(self.source, self.kind), branch, files, ranges, keys)
        except (ValueError, TableError):
            raise
        except Exception as exc:  # py4j's and pyspark's errors: the JVM's, whatever their class
            raise MergeFailed(f"table {self.name}: merge of commit {seq} failed: {first_line(exc)}") from exc
        pause_if(self.source, FaultPoint.UPSERT_STAGED)
        if result.parent_id != head.snapshot_id:
            raise CommitFailedException(
                f"table {self.name}: the merge's snapshot follows {result.parent_id}, not the head {head.snapshot_id}"
            )
        return Staged(head.snapshot_id, result.snapshot_id, branch, result.keys, result.cross_partition_keys)

    def _swap(self, base_id: int, snapshot_id: int, branch: str, commit: UpsertCommit, cross_total: int) -> None:
        """``main`` to the branch's head, the seq and the offsets, in one swap asserting ``main``
        is still ``base_id``; recorded in the swap (the metastore's catalog) or after it."""
        table = self.catalog.load_table(identifier(self.source, self.kind))
        if table.snapshot_by_id(snapshot_id) is None:
            # Expired meanwhile (its branch removed by a later committer): this attempt is stale.
            raise CommitFailedException(f"table {self.name}: the staged snapshot {snapshot_id} is gone")
        updates: tuple[TableUpdate, ...] = (
            SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id),  # type: ignore[call-arg]
        )
        if branch in table.metadata.refs:
            updates += (RemoveSnapshotRefUpdate(ref_name=branch),)  # type: ignore[call-arg]
        txn = table.transaction()
        txn._apply(updates, (AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=base_id),))  # type: ignore[call-arg]
        txn.set_properties(
            {
                COMMIT_SEQ: str(commit.seq),
                UPSERT_OFFSETS: json.dumps(dict(sorted(commit.offsets.items()))),
                CROSS_PARTITION_KEYS: str(cross_total),
            }
        )
        if isinstance(self.catalog, MetastoreCatalog):
            with self.catalog.fenced(partial(fence_upsert, commit=commit, url=self.store.url)) as fence:
                txn.commit_transaction()
            if not fence.ran:
                raise TableError(f"table {self.name}: commit {commit.seq} swapped nothing")
            return
        txn.commit_transaction()
        self.store.record_upsert(commit)

    def commit_pending(self) -> list[UpsertResult]:
        results: list[UpsertResult] = []
        while (result := self.commit_batch()) is not None:
            results.append(result)
        if results:
            self.maintain_if_due()
        return results

    def maintain_if_due(self, force: bool = False) -> None:
        """The table's delete files folded back and old snapshots expired, once there are
        ``MAINTAIN_AFTER_DELETE_FILES`` of them (``force``: any)."""
        from ingest.table.merge import delete_files

        spark = self.spark()
        name = spark_table_name(self.source, self.kind)
        count = delete_files(spark, name)
        if count == 0 or (count < MAINTAIN_AFTER_DELETE_FILES and not force):
            return
        started = time.monotonic()
        done = maintain(spark, name, self.settings.keep_snapshots)
        log.info(
            "upsert_table_maintained",
            source=self.source,
            delete_files=done.delete_files_before,
            rewritten_data_files=done.rewritten_data_files,
            removed_delete_files=done.removed_delete_files,
            expired_files=done.expired_files,
            seconds=round(time.monotonic() - started, 3),
        )

    def behind(self) -> tuple[int, datetime | None]:
        """Segment ranges with changes not merged yet (at most 1000 counted) and the oldest one's publish time."""
        state = self.store.upsert_state(self.source, self.kind)
        self.metrics.cross_partition_keys.labels(self.source).set(state.cross_partition_keys)
        pending = self.store.pending_ranges(self.source, state.offsets, 1000)
        return len(pending), min((r.published_at for r in pending), default=None)
