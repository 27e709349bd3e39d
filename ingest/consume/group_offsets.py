"""Published progress shown to Kafka's own tools: the consumer group's committed offsets.

After a split is published, its end offset is committed to the consumer group so that
``kafka-consumer-groups.sh --describe``, Burrow and KEDA's Kafka scaler see the true lag.
These commits are advice only:

- they are never read back and never used for positioning (the metastore's
  ``next_offset`` is the only position; a worker seeks there at every assign);
- they are asynchronous, at most one batch per ``interval_s``, and only for partitions
  this worker still owns (a commit for a partition that moved would be refused anyway);
- a commit that fails is counted and logged, never retried or raised: it cannot stop or
  slow ingestion, and the next publish commits a newer offset.

Every call happens on the polling thread (the consumer is not thread-safe for this);
librdkafka reports the outcome through ``on_commit`` from inside ``consume()``.
"""

from __future__ import annotations

import time

import structlog

from ingest.consume.kafka import Consumer, KafkaCallFailed
from ingest.ops.metrics import Metrics
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)

COMMIT_INTERVAL_S = 1.0
# A failing commit is logged at most this often (it is counted every time).
_LOG_EVERY_S = 60.0


class GroupOffsets:
    def __init__(self, source: str, metrics: Metrics, interval_s: float = COMMIT_INTERVAL_S) -> None:
        self._source = source
        self._metrics = metrics
        self._interval_s = interval_s
        self._pending: dict[TopicPartition, int] = {}
        self._due = 0.0
        self._logged_at = -_LOG_EVERY_S

    def published(self, tp: TopicPartition, next_offset: int) -> None:
        """A split of ``tp`` was published: ``next_offset`` is the partition's new stored offset."""
        if next_offset > self._pending.get(tp, -1):
            self._pending[tp] = next_offset

    def commit_due(self, consumer: Consumer, owned: set[TopicPartition], now: float | None = None) -> None:
        """Commit, asynchronously, what was published since the last commit (at most once per interval)."""
        now = time.monotonic() if now is None else now
        if not self._pending or now < self._due:
            return
        self._due = now + self._interval_s
        offsets = {tp: offset for tp, offset in self._pending.items() if tp in owned}
        self._pending.clear()
        if not offsets:
            return
        try:
            consumer.commit(offsets)
        except KafkaCallFailed as exc:  # not in a group right now, a closed consumer: advice lost, nothing else
            self._failed(str(exc), len(offsets))

    def committed(self, error: str | None, failed: int, partitions: int) -> None:
        """The outcome librdkafka reported for a commit (``ingest.consume.kafka.commit_callback`` adapts
        its ``on_commit``), from inside ``poll``."""
        if error is not None:
            self._failed(error, failed or partitions)
            return
        self._metrics.group_commits.labels(self._source, "ok").inc()

    def _failed(self, reason: str, partitions: int) -> None:
        self._metrics.group_commits.labels(self._source, "failed").inc()
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "group_commit_failed",
                source=self._source,
                partitions=partitions,
                error=reason,
                note="advice only: positions come from the metastore",
            )
