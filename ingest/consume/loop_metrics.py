"""The loop's gauges: per-partition lag (offsets and seconds), partitions cut from or not,
what is in flight and what waits in the log, and the worker's state."""

from __future__ import annotations

from ingest.consume.context import InFlight, LoopContext
from ingest.consume.log_ends import LogEnds
from ingest_common.model import TopicPartition, WorkerState

# Lag is computed at most this often.
LAG_INTERVAL_S = 1.0


class LoopGauges:
    def __init__(self, ctx: LoopContext, inflight: InFlight, log_ends: LogEnds) -> None:
        self._source = ctx.source
        self._assignment = ctx.assignment
        self._metrics = ctx.metrics
        self._inflight = inflight
        self._log_ends = log_ends
        self._lag_due = 0.0

    def update(self, state: WorkerState, now: float, *, cutting: frozenset[TopicPartition] = frozenset()) -> None:
        """``cutting``: the partitions splits may be cut from now (the others count as paused)."""
        source, m = self._source, self._metrics
        m.paused_partitions.labels(source).set(sum(1 for o in self._assignment if o.tp not in cutting))
        m.inflight_splits.labels(source).set(self._inflight.inflight_count)
        m.set_worker_state(state)
        m.inflight_bytes.labels(source).set(self._inflight.inflight_bytes)
        m.buffered_bytes.labels(source).set(sum(o.size.of(o.cutter.available()) for o in self._assignment))
        if now >= self._lag_due:
            self._lag_due = now + LAG_INTERVAL_S
            self._update_lag(now)

    def _update_lag(self, now: float) -> None:
        """Per-partition lag in offsets (the last stable offset minus the published offset)
        and in seconds (how long the oldest offset not yet published has been in the log,
        as this worker's log-end queries saw it appear)."""
        for owned in self._assignment:
            tp = owned.tp
            labels = (self._source, tp.topic, str(tp.partition))
            published = owned.published_end if owned.published_end is not None else owned.claim.next_offset
            end = self._log_ends.latest(tp)
            if end is not None and published is not None:
                self._metrics.partition_lag_records.labels(*labels).set(max(0, end.stable - published))
            oldest = self._inflight.oldest_available_at(tp)
            if oldest is None:
                oldest = owned.cutter.available_since()
            self._metrics.partition_lag_seconds.labels(*labels).set(0.0 if oldest is None else max(0.0, now - oldest))
