"""The loop's gauges: per-partition lag (records and seconds), paused partitions, what is
in flight and buffered, and the worker's state."""

from __future__ import annotations

import time

from ingest.consume.context import InFlight, LoopContext
from ingest_common.model import WorkerState

# Lag is read from the consumer's cached watermarks at most this often.
LAG_INTERVAL_S = 1.0


class LoopGauges:
    def __init__(self, ctx: LoopContext, inflight: InFlight) -> None:
        self._source = ctx.source
        self._consumer = ctx.consumer
        self._assignment = ctx.assignment
        self._metrics = ctx.metrics
        self._pipeline = inflight
        self._lag_due = 0.0

    def update(self, state: WorkerState, now: float) -> None:
        source, m = self._source, self._metrics
        m.paused_partitions.labels(source).set(len(self._consumer.paused()))
        m.inflight_splits.labels(source).set(self._pipeline.inflight_count)
        m.set_worker_state(state)
        m.inflight_bytes.labels(source).set(self._pipeline.inflight_bytes)
        m.buffered_bytes.labels(source).set(self._assignment.buffered_bytes())
        if now >= self._lag_due:
            self._lag_due = now + LAG_INTERVAL_S
            self._update_lag()

    def _update_lag(self) -> None:
        """Per-partition lag in records (Kafka's cached high watermark minus the published
        offset) and in seconds (age of the oldest record consumed but not yet published)."""
        now_ms = time.time() * 1000
        for owned in self._assignment:
            tp = owned.tp
            labels = (self._source, tp.topic, str(tp.partition))
            published = owned.published_end if owned.published_end is not None else owned.claim.next_offset
            high = self._consumer.high_watermark(tp)
            if high is not None and published is not None:
                self._metrics.partition_lag_records.labels(*labels).set(max(0, high - published))
            oldest = self._pipeline.oldest_pending_ms(tp)
            if oldest is None:
                oldest = owned.buffer.first_timestamp_ms()
            self._metrics.partition_lag_seconds.labels(*labels).set(
                0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
            )
