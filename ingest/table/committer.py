"""The table committer: every published segment's files appended to the source's Iceberg
table exactly once, without rewriting them (``add_files`` registers the Parquet files Spark
wrote; Iceberg field ids come from the table's name mapping, since Spark writes none).

Invariants, per table (``data``, and ``rejects`` when rejects go to a table):

- Every Iceberg commit this module makes sets the table property ``ingest.commit-seq`` to the
  previous value plus one and ``ingest.commit-segments`` to the segment ids it appended, in the
  same atomic catalog swap as the files. Table properties live in the table's current metadata:
  expiring snapshots cannot remove them (snapshot summaries carry the same values for audits
  only).
- The metastore records commit ``seq`` (its segment ids in ``ingest_table_segments``,
  ``ingest_tables.committed_seq``) in the PostgreSQL transaction in which the catalog swaps the
  table's metadata pointer (``metastore.tables.fence_commit``): both happen, or neither. That
  transaction also refuses the commit (a conflict, retried from the reconcile) unless every
  segment it appends is still current and not held yet, and the held segments its segments
  replaced are exactly those it takes out; the appended segments stay locked until it ends, so
  a replacement of them is ordered after the commit and its record. So however long a committer
  was frozen between choosing a batch and committing it, it never appends a segment replaced
  meanwhile (whose files gc may have deleted one grace period after the replacement: gc keeps
  only the files of segments a table is recorded as holding), nor one beside the segments it
  replaced. A batch is read in one snapshot of the metastore (``TableStore.next_batch``), so
  it never holds a segment and one it replaced.
- In a catalog outside the metastore (a spec's ``[table] catalog``) the swap is no transaction
  of the metastore: the same check records an intent before the swap
  (``TableStore.record_intent``; gc keeps the files of a live intent's segments) and the commit
  is recorded after it (a crash between the two is the reconcile's case below). Every commit is
  a snapshot that asserts the branch head it was built on, so once the table moved the catalog
  refuses a commit chosen before, forever; one frozen after its intent on an unmoved table
  lands, and the next commit follows the replacements made meanwhile (docs/iceberg.md).
- Before appending anything the committer reconciles: a table at ``seq + 1`` and a metastore
  at ``seq`` is a commit recorded outside the swap (by a committer that recorded after its
  swap, and died between the two), and the metastore is advanced from the table's properties;
  any other difference stops the committer (:class:`TableDiverged`). So a segment is never
  appended twice (what the table holds is recorded before the next batch is chosen) and never
  skipped (a batch is every published segment the metastore does not list as held, whatever
  order ids became visible in).
- A batch chosen for commit ``seq`` is appended only onto a table whose ``ingest.commit-seq``
  is ``seq - 1`` (the state it was chosen from), and the catalog swap is a compare-and-swap on
  the metadata location: of two committers that chose a batch from the same table state, one
  fails and re-reconciles. That holds for the table's first commit too: a committer that finds
  the table created by another one meanwhile (its create refused, either as
  ``TableAlreadyExistsError`` or as ``CommitFailedException``) starts over from loading and
  reconciling that table, never appends its batch to it. The PostgreSQL advisory lock (one
  committer per source) only saves that wasted work; correctness does not depend on it, so
  committers that both hold it (a lost lock connection after a PostgreSQL restart, ``--once``
  beside a running committer) cannot duplicate anything. A ``CommitFailedException`` anywhere in
  a commit is a conflict the committer retries, never the end of its loop.
- A pending segment that replaced segments the table holds (compaction) is committed alone, as
  one overwrite snapshot: their files out, its files in, the same rows
  (``ingest.table.replacement``). It is numbered, guarded and recorded like an append; the
  record also marks the segments it took out (``removed_seq``, in the same transaction), and
  ``ingest.commit-replaced`` names them in the table, so a reconcile records them too. So a
  replacement is applied once: after its record the replaced segments are no longer held, and
  no pending segment supersedes them again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import structlog
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Snapshot

from ingest.spec.model import SourceSpec
from ingest.table.catalog import MetastoreCatalog, close_catalog, identifier, open_catalog, table_location
from ingest.table.config import CommitSettings, PartitionBy
from ingest.table.errors import CommitConflicts, SegmentsRefused, TableDiverged, TableError, file_refused
from ingest.table.faults import FaultPoint, pause_if
from ingest.table.metrics import TableMetrics
from ingest.table.properties import COMMIT_REPLACED, COMMIT_SEGMENTS, COMMIT_SEQ, NO_REBASE, at_commit, segment_ids
from ingest.table.refusals import Refusals
from ingest.table.replacement import stage_replacement
from ingest.table.role import committer_health
from ingest.table.schema import evolve, file_schema, transform_of
from ingest.table.upsert import UpsertCommitter
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line
from metastore.tables import (
    PendingSegment,
    StaleTableCommit,
    TableCommit,
    TableKind,
    TableRow,
    TableStore,
    fence_commit,
)
from metastore.upserts import UpsertStore

log = structlog.get_logger(__name__)

# A catalog conflict (another committer moved the table): 0.1, 0.2, ... 2 s before the next attempt.
CONFLICT_RETRY = Backoff(0.1, 2.0)


@dataclass(frozen=True, slots=True)
class CommitResult:
    kind: TableKind
    seq: int
    segment_ids: tuple[int, ...]
    files: int
    seconds: float
    conflicts: int


class TableCommitter:
    def __init__(
        self,
        database_url: str,
        source: str,
        settings: CommitSettings | None = None,
        metrics: TableMetrics | None = None,
    ) -> None:
        self.source = source
        self.settings = settings or CommitSettings()
        self.store = UpsertStore(database_url)
        try:
            # The catalog of the spec the committer starts with (CatalogUnavailable: one line).
            self.catalog = open_catalog(database_url, self._spec().table)
        except BaseException:
            self.store.close()
            raise
        self.metrics = metrics or TableMetrics(source)
        self.health = committer_health(source, self.settings)
        # Segments the table cannot take: set aside, pending, retried (ingest.table.refusals).
        self.refusals = Refusals(self.store, source, self.health, self.metrics, self.settings.refused_retry)
        self._last_commit: dict[TableKind, float] = {}
        # (table, spec version, table schema id) whose files' schema the table already covers.
        self._schema_checked: set[tuple[TableKind, int, int]] = set()
        # An upsert source's data table (ingest.table.upsert; its Spark session made when first due).
        self._upsert = UpsertCommitter(
            self.store, self.catalog, database_url, source, self.settings, self.metrics, self._spec
        )

    def close(self) -> None:
        self.store.close()
        close_catalog(self.catalog)
        self._upsert.close()

    def upserts(self, kind: TableKind) -> UpsertCommitter | None:
        """The upsert committer when ``kind`` is an upsert source's data table, else None."""
        return self._upsert if kind is TableKind.DATA and self._spec().table.upsert else None

    def __enter__(self) -> TableCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the table ------------------------------------------------------------------

    def kinds(self) -> list[TableKind]:
        kinds = [row.kind for row in self.store.tables(self.source)]
        if not kinds:
            raise TableError(
                f"source {self.source!r} has no Iceberg table: enable one with `ingest table-enable {self.source}`"
            )
        return kinds

    def _spec(self) -> SourceSpec:
        return SourceSpec.from_json(self.store.latest_spec(self.source))

    def load(self, kind: TableKind) -> Table | None:
        try:
            return self.catalog.load_table(identifier(self.source, kind))
        except NoSuchTableError:
            return None

    def _create(self, row: TableRow, first_file: str) -> Table:
        """The table, created from the schema of the first file it will hold. Another committer
        that created it first makes this raise (TableAlreadyExistsError, or CommitFailedException
        when the catalog saw the table before its insert): the caller starts over."""
        spec = self._spec()
        ident = identifier(self.source, row.kind)
        self.catalog.create_namespace_if_not_exists(ident[0])
        # gc.enabled=false: the table does not own its data files (the metastore does), so
        # Iceberg maintenance must never delete one (see docs/iceberg.md, "gc and table maintenance agree").
        properties = {
            "gc.enabled": "false",
            COMMIT_SEQ: "0",
            "ingest.source": self.source,
            "ingest.table": row.kind,
            **NO_REBASE,
        }
        # Another catalog places the table in its own warehouse (a REST catalog may refuse or
        # ignore a location outside it).
        location = (
            table_location(spec.segment_store, self.source, row.kind)
            if isinstance(self.catalog, MetastoreCatalog)
            else None
        )
        txn = self.catalog.create_table_transaction(
            ident, schema=file_schema(first_file), location=location, properties=properties
        )
        transform = transform_of(PartitionBy(row.partition_by))
        if row.kind is TableKind.DATA and transform is not None:
            with txn.update_spec() as update:
                update.add_field(spec.event_time, transform, f"{spec.event_time}_{row.partition_by}")
        table = txn.commit_transaction()
        log.info("table_created", source=self.source, table=row.kind.value, location=table.location())
        return table

    def reconcile(self, kind: TableKind, table: Table | None) -> int:
        """Bring the metastore's record up to what the table holds; returns the commit seq both
        agree on. A commit recorded outside its swap (a committer that recorded after the swap
        and died between the two) leaves the table one commit ahead: that commit is recorded
        now, from the table's own properties."""
        row = self.store.table(self.source, kind)
        if table is None:
            if row.committed_seq:
                raise TableDiverged(
                    f"table {'.'.join(identifier(self.source, kind))} is gone from the catalog but the metastore "
                    f"recorded {row.committed_seq} commit(s) to it; nothing is appended until it is restored"
                )
            return 0
        held = int(table.properties.get(COMMIT_SEQ, "0"))
        if held == row.committed_seq:
            return held
        if held != row.committed_seq + 1:
            raise TableDiverged(
                f"table {'.'.join(identifier(self.source, kind))} holds commit {held} but the metastore recorded "
                f"{row.committed_seq}: the table was changed outside the committer; nothing is appended"
            )
        ids = segment_ids(table, COMMIT_SEGMENTS)
        removed = segment_ids(table, COMMIT_REPLACED)
        snapshot = table.current_snapshot()
        ours = snapshot is not None and snapshot.summary is not None and snapshot.summary.get(COMMIT_SEQ) == str(held)
        at = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC) if ours and snapshot else datetime.now(UTC)
        snapshot_id = snapshot.snapshot_id if ours and snapshot else None
        self.store.record_commit(self.source, kind, held, ids, snapshot_id, at, removed)
        log.warning(
            "table_commit_reconciled",
            source=self.source,
            table=kind.value,
            seq=held,
            segments=len(ids),
            removed=len(removed),
        )
        return held

    # -- committing -----------------------------------------------------------------

    def commit_batch(self, kind: TableKind) -> CommitResult | None:
        """One Iceberg commit of up to ``batch_segments`` pending segments (None: none pending).
        Catalog conflicts are retried from the reconcile step, at most ``max_attempts`` times; a
        batch the table cannot take is halved until the segment it refuses is set aside
        (ingest.table.refusals), and the others are committed."""
        conflicts = 0
        while conflicts < self.settings.max_attempts:
            started = time.monotonic()
            table = self.load(kind)
            seq = self.reconcile(kind, table) + 1
            batch = self.refusals.next_batch(kind, self.settings.batch_segments)
            if not batch:
                return None
            replacing = batch[0].supersedes
            try:
                if table is None:
                    table = self._create(self.store.table(self.source, kind), batch[0].files[0])
                if replacing:
                    committed = self._replace(table, kind, seq, batch[0])
                else:
                    committed = self._append(table, kind, seq, batch)
            except (CommitFailedException, TableAlreadyExistsError) as exc:
                # Another committer changed (or created) the table since it was loaded: the
                # next attempt loads and reconciles what it holds now.
                self.health.progressed()
                conflicts += 1
                self.metrics.commit_conflicts.labels(self.source, kind.value).inc()
                log.warning(
                    "table_commit_conflict", source=self.source, table=kind.value, seq=seq, error=first_line(exc)
                )
                CONFLICT_RETRY.sleep(CONFLICT_RETRY.delay(conflicts - 1))
                continue
            except SegmentsRefused as exc:  # its files, not an outage: the same batch fails again
                self.health.progressed()
                self.refusals.failed(kind, batch, exc)
                continue
            pause_if(self.source, FaultPoint.ICEBERG_COMMITTED)
            if not isinstance(self.catalog, MetastoreCatalog):
                # Recorded after the swap: a crash before this line leaves the table one commit
                # ahead, which the next reconcile records (its intent keeps the files till then).
                self._record(committed, kind, seq, batch)
            ids = tuple(s.id for s in batch)
            self.refusals.committed(kind, ids)
            _expire_snapshots(self.source, self.settings.keep_snapshots, committed, kind)
            self.health.progressed()
            seconds = time.monotonic() - started
            files = sum(len(s.files) for s in batch)
            self.metrics.commit_seconds.labels(self.source, kind.value).observe(seconds)
            self.metrics.commits.labels(self.source, kind.value).inc()
            self.metrics.segments_committed.labels(self.source, kind.value).inc(len(batch))
            if replacing:
                self.metrics.replacements.labels(self.source, kind.value).inc()
            log.info(
                "table_committed",
                source=self.source,
                table=kind.value,
                seq=seq,
                segments=len(batch),
                replaced=len(replacing),
                first_segment=ids[0],
                last_segment=ids[-1],
                files=files,
                seconds=round(seconds, 4),
            )
            return CommitResult(kind, seq, ids, files, seconds, conflicts)
        raise CommitConflicts(
            f"table {'.'.join(identifier(self.source, kind))}: {conflicts} commit conflicts in a row; "
            "another process keeps changing the table"
        )

    def _replace(self, table: Table, kind: TableKind, seq: int, segment: PendingSegment) -> Table:
        """Commit ``seq``: the segment's files replace those of the held segments it replaced,
        in one overwrite snapshot (``ingest.table.replacement``), onto a table at ``seq - 1``."""
        table = at_commit(table, seq)
        txn = table.transaction()
        name = ".".join(identifier(self.source, kind))
        if segment.files:
            evolve(txn, name, kind, [segment], self._schema_checked)
        out, new = stage_replacement(txn, table, name, segment, seq)
        log.info("table_replacing", source=self.source, table=kind.value, seq=seq, files_out=out, files_in=new)
        return self._commit(txn, kind, seq, [segment])

    def _append(self, table: Table, kind: TableKind, seq: int, batch: Sequence[PendingSegment]) -> Table:
        """Append the batch as commit ``seq`` onto ``table``, which must hold commit ``seq - 1``
        (the state the batch was chosen from); any other table is a conflict."""
        table = at_commit(table, seq)
        txn = table.transaction()
        evolve(txn, ".".join(identifier(self.source, kind)), kind, batch, self._schema_checked)
        files = [f for s in batch for f in s.files]
        ids = [s.id for s in batch]
        try:
            txn.add_files(
                files,
                snapshot_properties={
                    COMMIT_SEQ: str(seq),
                    "ingest.first-segment": str(ids[0]),
                    "ingest.last-segment": str(ids[-1]),
                    "ingest.segments": str(len(ids)),
                },
                # The metastore says which segments the table holds; scanning every manifest for
                # duplicates would make each commit cost as much as the whole table.
                check_duplicate_files=False,
            )
        except (ValueError, ArithmeticError) as exc:
            raise file_refused(".".join(identifier(self.source, kind)), tuple(ids), exc) from exc
        txn.set_properties({COMMIT_SEQ: str(seq), COMMIT_SEGMENTS: ",".join(map(str, ids)), COMMIT_REPLACED: ""})
        return self._commit(txn, kind, seq, batch)

    def _commit(self, txn: Transaction, kind: TableKind, seq: int, batch: Sequence[PendingSegment]) -> Table:
        """Commit ``txn`` as commit ``seq`` of the batch (:func:`_swap`)."""
        commit = _table_commit(self.source, kind, seq, batch, txn.table_metadata.current_snapshot())
        return _swap(self.catalog, self.store, txn, commit)

    def _record(self, table: Table, kind: TableKind, seq: int, batch: Sequence[PendingSegment]) -> None:
        """Record commit ``seq``, which ``table`` (the catalog's answer to its swap) holds."""
        commit = _table_commit(self.source, kind, seq, batch, table.current_snapshot())
        self.store.record_commit(
            self.source, kind, seq, commit.segment_ids, commit.snapshot_id, commit.committed_at, commit.removed_ids
        )

    def commit_pending(self, kind: TableKind) -> list[CommitResult]:
        """Commit until no segment is pending (each commit at most ``batch_segments``)."""
        if (upserts := self.upserts(kind)) is not None:
            merged = [
                CommitResult(kind, r.seq, r.segment_ids, 0, r.seconds, r.conflicts) for r in upserts.commit_pending()
            ]
            self._last_commit[kind] = time.monotonic()
            self.update_behind(kind)
            return merged
        results: list[CommitResult] = []
        while (result := self.commit_batch(kind)) is not None:
            results.append(result)
        self._last_commit[kind] = time.monotonic()
        self.update_behind(kind)
        return results

    def update_behind(self, kind: TableKind) -> tuple[int, datetime | None]:
        upserts = self.upserts(kind)
        behind, oldest = self.store.behind(self.source, kind) if upserts is None else upserts.behind()
        self.metrics.segments_behind.labels(self.source, kind.value).set(behind)
        age = (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        self.metrics.lag_seconds.labels(self.source, kind.value).set(max(age, 0.0))
        return behind, oldest

    def last_commit_at(self, kind: TableKind) -> float:
        """When (``time.monotonic()``) the table was last brought up to date; 0: never."""
        return self._last_commit.get(kind, 0.0)

    def commit_all(self) -> list[CommitResult]:
        """Commit every pending segment of every table of the source once (``--once``), under the
        committer lock; refuses while another committer holds it."""
        if not self.store.try_lock(self.source):
            raise TableError(f"another committer holds the table lock of source {self.source!r}")
        try:
            return [r for kind in self.kinds() for r in self.commit_pending(kind)]
        finally:
            self.store.unlock()


def _swap(catalog: Catalog, store: TableStore, txn: Transaction, commit: TableCommit) -> Table:
    """The catalog's swap of ``txn``, refused as a conflict (CommitFailedException), and nothing
    swapped, if a segment of the batch was replaced (or the held segments it replaces changed)
    since the batch was chosen, however long ago that was. In the metastore's catalog the commit
    is recorded in the transaction of the swap (``metastore.tables.fence_commit``); in another
    catalog the same check records an intent before the swap (``TableStore.record_intent``: gc
    keeps the batch's files while it is live) and the committer records the commit after it."""
    if not isinstance(catalog, MetastoreCatalog):
        try:
            store.record_intent(commit)
        except StaleTableCommit as exc:
            raise CommitFailedException(str(exc)) from exc
        return txn.commit_transaction()
    with catalog.fenced(partial(fence_commit, commit=commit, url=store.url)) as fence:
        table = txn.commit_transaction()
    if not fence.ran:
        raise TableError(f"table {commit.source}/{commit.kind.value}: commit {commit.seq} swapped nothing")
    return table


def _table_commit(
    source: str, kind: TableKind, seq: int, batch: Sequence[PendingSegment], snapshot: Snapshot | None
) -> TableCommit:
    """Commit ``seq`` of the batch as the metastore records it, made as ``snapshot``."""
    return TableCommit(
        source,
        kind,
        seq,
        tuple(s.id for s in batch),
        snapshot.snapshot_id if snapshot else None,
        datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC) if snapshot else datetime.now(UTC),
        tuple(i for s in batch for i in s.supersedes),
    )


def _expire_snapshots(source: str, keep: int, table: Table, kind: TableKind) -> None:
    """Keep the newest ``keep`` snapshots. pyiceberg expires metadata only (and the table says
    gc.enabled=false for every other engine): no data file is deleted. Which segments the table
    holds is in its properties and the metastore, never in snapshots."""
    snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    if len(snapshots) <= keep:
        return
    oldest_kept = snapshots[-keep]
    try:
        table.maintenance.expire_snapshots().older_than(
            datetime.fromtimestamp(oldest_kept.timestamp_ms / 1000, UTC)
        ).commit()
    except CommitFailedException as exc:  # the next commit expires them
        log.info("table_expire_skipped", source=source, table=kind.value, error=first_line(exc))


__all__ = ["COMMIT_SEQ", "CommitResult", "TableCommitter"]
