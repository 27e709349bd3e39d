"""What the loop does with each finished split: count and log it, advance the partition's
published offset and learn its bytes per offset, fence or rewind the partition after a refusal
or a failure, and judge the worker's health from failures in a row.

An outcome acts on a partition only if it is *current*: the partition is still owned, under
the same claim (serial) and cut generation the split was cut in. Anything older was already
superseded by a rewind, a reset or a new assignment.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from ingest.consume.assignment import OwnedPartition
from ingest.consume.context import LoopContext
from ingest.consume.group_offsets import GroupOffsets
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.positioning import Positioner
from ingest.errors import WorkerFailed
from ingest.publish.settle import Conflicted, Failed, Fatal, Killed, Outcome, Published
from ingest_common.model import ConflictReason

log = structlog.get_logger(__name__)

# Default of splits that failed (each after its build retries) in a row, with no publish in
# between, before the worker reports itself unhealthy: a broken Spark session or an unwritable
# store does not heal by rewinding, and an orchestrator restarts a worker whose /healthz fails.
UNHEALTHY_AFTER_FAILED_SPLITS = 5


class OutcomeHandler:
    def __init__(
        self,
        ctx: LoopContext,
        *,
        positioner: Positioner,
        registry: WorkerRegistry,
        group_offsets: GroupOffsets | None = None,
        unhealthy_after: int = UNHEALTHY_AFTER_FAILED_SPLITS,
    ) -> None:
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._assignment = ctx.assignment
        self._metrics = ctx.metrics
        self._positioner = positioner
        self._registry = registry
        self._group_offsets = group_offsets
        self._unhealthy_after = unhealthy_after
        # Failed splits since the last publish, and the last failure (the cause reported).
        self._failed_streak = 0
        self._last_failure = ""

    @property
    def unhealthy_reason(self) -> str | None:
        """Why the worker should be restarted, or None. Offsets never advance past a failed
        split (it is rewound and re-read), so this only surfaces a worker that makes no progress."""
        if self._failed_streak < self._unhealthy_after:
            return None
        return f"{self._failed_streak} splits failed in a row, none published since; last: {self._last_failure}"

    def handle(self, outcomes: list[Outcome], *, draining: bool) -> None:
        """While draining, refused and failed splits are counted but nothing is repositioned:
        the worker is about to leave and the next owner reads from the stored offset."""
        for outcome in outcomes:
            split = outcome.split
            owned = self._assignment.get(split.tp)
            if owned is not None and (owned.claim.serial != split.serial or owned.epoch != split.epoch):
                owned = None
            fields = {
                "source": self._source,
                "topic": split.tp.topic,
                "partition": split.tp.partition,
                "start": split.start,
                "end": split.end,
                "split": str(split.id),
            }
            act_on = None if draining else owned
            if isinstance(outcome, Published):
                self._published(outcome, owned, fields)
            elif isinstance(outcome, Killed):
                self._metrics.splits_killed.labels(self._source, outcome.reason).inc()
                log.info("split_killed", reason=outcome.reason, files=outcome.files, **fields)
            elif isinstance(outcome, Conflicted):
                self._conflicted(outcome, act_on, fields)
            elif isinstance(outcome, Failed):
                self._failed(outcome, act_on, fields)
            elif isinstance(outcome, Fatal):
                self._registry.error("PARSE_FAILURE", str(outcome.error))
                raise outcome.error

    def _conflicted(self, outcome: Conflicted, owned: OwnedPartition | None, fields: dict[str, Any]) -> None:
        reason = outcome.conflict.reason
        self._metrics.publish_conflicts.labels(self._source, reason).inc()
        self._registry.error("PUBLISH_CONFLICT", str(outcome.conflict))
        log.warning(
            "publish_rejected",
            reason=reason,
            expected=outcome.conflict.expected,
            stored=outcome.conflict.actual,
            files=outcome.files,
            **fields,
        )
        if owned is None:
            return
        if reason == ConflictReason.SERIAL:
            owned.fence()
            log.warning("partition_fenced", **fields)
        else:
            self._positioner.rewind(owned)

    def _failed(self, outcome: Failed, owned: OwnedPartition | None, fields: dict[str, Any]) -> None:
        split = outcome.split
        if isinstance(outcome.error, WorkerFailed):
            # Nothing in this process can build again (the Spark driver JVM exited): the worker
            # stops (its last words record why), its partitions go to the group, and the
            # supervisor starts a new one.
            raise outcome.error
        self._metrics.split_failures.labels(self._source, outcome.stage).inc()
        self._failed_streak += 1
        self._last_failure = f"{outcome.stage} of {split.tp} [{split.start}, {split.end}): {outcome.error}"
        if self._failed_streak == self._unhealthy_after:
            log.error("worker_unhealthy", source=self._source, worker=self._worker_id, reason=self.unhealthy_reason)
        self._registry.error(f"{outcome.stage.upper()}_FAILED", f"{split.tp}: {outcome.error}")
        log.error("split_failed", stage=outcome.stage, error=str(outcome.error), files=outcome.files, **fields)
        if owned is not None:
            self._positioner.rewind(owned)

    def _published(self, outcome: Published, owned: OwnedPartition | None, fields: dict[str, Any]) -> None:
        seg = outcome.segment
        source = self._source
        m = self._metrics
        m.segments_published.labels(source).inc()
        m.records_consumed.labels(source).inc(seg.records)
        m.bytes_consumed.labels(source).inc(seg.record_bytes)
        m.records_published.labels(source).inc(seg.row_count)
        m.count_parse_errors(seg)
        m.build_seconds.labels(source).observe(seg.build_seconds)
        m.publish_seconds.labels(source).observe(outcome.publish_seconds)
        m.segment_rows.labels(source).observe(seg.row_count)
        m.segment_bytes.labels(source).observe(seg.size_bytes)
        newest_ms = seg.last_timestamp_ms
        if newest_ms is not None and newest_ms > 0:
            m.visible_latency.labels(source).observe(max(0.0, time.time() - newest_ms / 1000))
        self._failed_streak = 0
        if owned is not None:
            tp = outcome.split.tp
            owned.published(outcome.split.end)
            owned.size.update(seg.record_bytes, outcome.split.offsets)
            if self._group_offsets is not None:
                self._group_offsets.published(tp, outcome.split.end)
            m.partition_next_offset.labels(source, tp.topic, str(tp.partition)).set(outcome.split.end)
        log.info(
            "segment_published",
            segment_id=outcome.segment_id,
            rows=seg.row_count,
            offsets=outcome.split.offsets,
            rejects=seg.rejects_count,
            skipped=seg.skipped_count,
            bytes=seg.size_bytes,
            build_s=round(seg.build_seconds, 3),
            publish_ms=round(outcome.publish_seconds * 1000, 2),
            **fields,
        )
