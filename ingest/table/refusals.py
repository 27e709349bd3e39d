"""Segments a table cannot take, and what the committer does about them.

A commit can fail because of a segment's files themselves, whatever the servers do: a value
Iceberg's column statistics cannot hold (a string that is not UTF-8, a timestamp outside years
1-9999, both of which the builder makes rejects of since: docs/architecture.md, parse errors),
a file that does not read as Parquet. pyiceberg says so as a ValueError or an OverflowError
while it reads the files' footers (:class:`SegmentsRefused` once the committer wrapped it);
nothing was appended. Retrying the same batch would fail the same way, for good, and stop the
table behind that segment; skipping the segment would lose its records from the table.

So the committer finds the segment and sets it aside, and nothing else:

- A refused batch of several segments is halved (its first half is the next batch, then the
  rest as the batches come) until the batch that fails is one segment: that segment is
  *refused*. A batch of one is refused at once (a replacement is always one).
- A refused segment stays pending: the table does not hold it, ``ingest_table_segments`` does
  not list it, so the table is behind by it (``ingest_table_segments_behind``, the lag, the
  ``IngestTableBehind`` alert) and every published segment is still appended exactly once in
  the end. Batches pass over it while it waits; the segments after it are appended.
- It is tried again alone on the committer's ``refused_retry`` backoff (10 s doubling to 10
  minutes; a new committer process tries each one at once): a committer that can take it now
  (a fixed version) appends it and the refusal is gone in the same transaction as the record.
- Each refusal is recorded in the metastore (migrations/0026: error, attempts, first and last
  time) and shown by ``ingest status``, ``ingest table``, ``ingest audit`` (a finding) and the
  committer's /healthz and /readyz (``RoleHealth.note``), and counted by
  ``ingest_table_segments_refused``. A refused segment that compaction replaces is no longer
  pending: its replacement holds the same records and is refused or appended in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from ingest.roles.health import RoleHealth
from ingest.table.errors import SegmentsRefused
from ingest.table.metrics import TableMetrics
from ingest_common.backoff import Backoff
from ingest_common.errors import first_line
from metastore.tables import PendingSegment, TableKind, TableStore

log = structlog.get_logger(__name__)

# How many refused segments the health's one line names (the rest are counted).
_NAMED = 3


@dataclass(slots=True)
class _Refused:
    error: str
    attempts: int
    # When it is tried again (its backoff's clock).
    due_at: float


class Refusals:
    """One committer's refused segments per table, and its batches around them."""

    def __init__(
        self, store: TableStore, source: str, health: RoleHealth, metrics: TableMetrics, retry: Backoff
    ) -> None:
        self._store = store
        self._source = source
        self._health = health
        self._metrics = metrics
        self._retry = retry
        self._refused: dict[TableKind, dict[int, _Refused]] = {}
        # The batch size while a refused batch is halved (none: the committer's own).
        self._limit: dict[TableKind, int] = {}

    def of(self, kind: TableKind) -> dict[int, str]:
        """The table's refused segments and their errors, as this committer knows them."""
        return {segment_id: r.error for segment_id, r in sorted(self._known(kind).items())}

    def next_batch(self, kind: TableKind, limit: int) -> list[PendingSegment]:
        """A refused segment whose retry is due, alone; else the next batch (at most ``limit``
        segments, fewer while a refused batch is halved), passing over the refused ones."""
        refused = self._known(kind)
        now = self._retry.clock.monotonic()
        for segment_id in sorted(i for i, r in refused.items() if r.due_at <= now):
            segment = self._store.pending_segment(self._source, kind, segment_id)
            if segment is not None:
                return [segment]
            # The table holds it, or compaction replaced it: no longer refused.
            del refused[segment_id]
            self._store.clear_refusals(self._source, kind, [segment_id])
            self._report(kind)
        batch = self._store.next_batch(self._source, kind, self._limit.get(kind, limit), skip=frozenset(refused))
        if not batch:
            self._limit.pop(kind, None)
        return batch

    def failed(self, kind: TableKind, batch: list[PendingSegment], exc: SegmentsRefused) -> None:
        """The table could not take ``batch``: halve it, or refuse its one segment."""
        error = first_line(exc)
        if len(batch) > 1:
            self._limit[kind] = len(batch) // 2
            log.warning(
                "table_batch_refused",
                source=self._source,
                table=kind.value,
                segments=len(batch),
                first_segment=batch[0].id,
                last_segment=batch[-1].id,
                next_batch=self._limit[kind],
                error=error,
            )
            return
        self._limit.pop(kind, None)
        segment_id = batch[0].id
        refused = self._known(kind)
        attempts = refused[segment_id].attempts + 1 if segment_id in refused else 1
        delay = self._retry.delay(attempts - 1)
        refused[segment_id] = _Refused(error, attempts, self._retry.clock.monotonic() + delay)
        self._store.refuse(self._source, kind, segment_id, error)
        log.error(
            "table_segment_refused",
            source=self._source,
            table=kind.value,
            segment=segment_id,
            attempts=attempts,
            retry_in_s=delay,
            error=error,
        )
        self._report(kind)

    def committed(self, kind: TableKind, segment_ids: tuple[int, ...]) -> None:
        """The table holds these now (their refusals were deleted with the commit's record)."""
        refused = self._known(kind)
        if cleared := [i for i in segment_ids if refused.pop(i, None) is not None]:
            log.info("table_segment_taken", source=self._source, table=kind.value, segments=cleared)
            self._report(kind)

    def _known(self, kind: TableKind) -> dict[int, _Refused]:
        """Loaded from the metastore on first use: a new process tries each one at once."""
        if kind not in self._refused:
            now = self._retry.clock.monotonic()
            self._refused[kind] = {
                int(r["segment_id"]): _Refused(str(r["error"]), int(r["attempts"]), now)
                for r in self._store.refusals(self._source)
                if r["kind"] == kind.value
            }
            self._report(kind)
        return self._refused[kind]

    def _report(self, kind: TableKind) -> None:
        self._metrics.segments_refused.labels(self._source, kind.value).set(len(self._refused.get(kind, {})))
        parts = []
        for table, refused in sorted(self._refused.items()):
            if not refused:
                continue
            named = sorted(refused.items())[:_NAMED]
            more = f" and {len(refused) - _NAMED} more" if len(refused) > _NAMED else ""
            parts.append(
                f"table {table.value} refused segment(s) "
                + ", ".join(f"{i} ({r.attempts} attempt(s): {r.error})" for i, r in named)
                + f"{more}; pending, retried"
            )
        self._health.note("; ".join(parts))
