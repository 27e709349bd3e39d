"""Rebalance callbacks: claim on assign, kill on revoke and lost.

- assign: one metastore transaction bumps the serial of every newly assigned partition
  and reads its stored offset; the partition is then assigned at exactly that offset
  (no stored offset: the source's start position).
- revoke / lost: trip the kill switch of every in-flight split of those partitions and
  drop their buffers. Partitions that stay assigned keep everything. ``on_lost`` does
  nothing else; ``on_revoke`` also clears the owner in the metastore (status only).
- Everything inside one callback shares one deadline, well under max.poll.interval.ms.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import structlog
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.assignment import Assignment
from ingest.metrics import Metrics
from ingest.pipeline import Pipeline
from ingest_common.model import KillReason, PartitionClaim, RebalanceKind, TopicPartition
from metastore.errors import MetastoreError

log = structlog.get_logger(__name__)


class ClaimStore(Protocol):
    def claim_partitions(
        self, source: str, worker: str, tps: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionClaim]: ...
    def release_partition(self, source: str, worker: str, claim: PartitionClaim) -> None: ...


def start_offset(claim: PartitionClaim) -> int:
    if claim.next_offset is not None:
        return claim.next_offset
    return OFFSET_BEGINNING if claim.initial_position == "earliest" else OFFSET_END


class RebalanceHandler:
    def __init__(
        self,
        *,
        source: str,
        worker_id: str,
        store: ClaimStore,
        assignment: Assignment,
        pipeline: Pipeline,
        metrics: Metrics,
        incremental: bool,
        deadline_s: float = 30.0,
        claim_retry_s: float = 0.5,
    ) -> None:
        self._source = source
        self._worker_id = worker_id
        self._store = store
        self._assignment = assignment
        self._pipeline = pipeline
        self._metrics = metrics
        self._incremental = incremental
        self._deadline_s = deadline_s
        self._claim_retry_s = claim_retry_s
        # Set when a callback could not do its job; the loop raises it after consume() returns
        # (exceptions raised inside librdkafka callbacks are easy to lose).
        self.error: Exception | None = None

    @property
    def incremental(self) -> bool:
        """Cooperative (incremental) assignment, or eager."""
        return self._incremental

    # -- callbacks -----------------------------------------------------------------

    def on_assign(self, consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
        started = time.monotonic()
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        claims = self._claim(tps, started + self._deadline_s) if tps else {}
        if claims is None:
            # Without a claim the stored offset is unknown: consuming would risk re-reading or
            # skipping, so the worker stops (its partitions move to the others).
            self._assign(consumer, [])
            return
        for p in partitions:
            p.offset = start_offset(claims[TopicPartition(p.topic, p.partition)])
        self._assign(consumer, partitions)
        for claim in claims.values():
            self._assignment.add(claim)
        self._observe(RebalanceKind.ASSIGN, started)
        log.info(
            "partitions_assigned",
            source=self._source,
            worker=self._worker_id,
            partitions=[
                f"{c.tp}@{c.next_offset if c.next_offset is not None else c.initial_position}#{c.serial}"
                for c in sorted(claims.values(), key=lambda c: c.tp)
            ],
            assigned=len(self._assignment),
        )

    def on_revoke(self, consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
        self._drop(consumer, partitions, RebalanceKind.REVOKE)

    def on_lost(self, consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
        self._drop(consumer, partitions, RebalanceKind.LOST)

    # -- internals -----------------------------------------------------------------

    def _claim(self, tps: list[TopicPartition], deadline: float) -> dict[TopicPartition, PartitionClaim] | None:
        while True:
            try:
                return self._store.claim_partitions(self._source, self._worker_id, tps)
            except MetastoreError as exc:
                self._metrics.metastore_errors.labels(self._source).inc()
                if time.monotonic() + self._claim_retry_s >= deadline:
                    self.error = exc
                    log.error("claim_failed", source=self._source, worker=self._worker_id, error=str(exc))
                    return None
                log.warning("claim_retry", source=self._source, worker=self._worker_id, error=str(exc))
                time.sleep(self._claim_retry_s)

    def _assign(self, consumer: Any, partitions: list[KafkaTopicPartition]) -> None:
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if partitions:
            # librdkafka keeps a partition's pause flag across an eager unassign/assign; the
            # loop's invariant is that a new assignment starts unpaused, so make it true.
            consumer.resume(partitions)

    def _drop(self, consumer: Any, partitions: list[KafkaTopicPartition], kind: RebalanceKind) -> None:
        started = time.monotonic()
        deadline = started + self._deadline_s
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        killed = self._pipeline.kill(tps, KillReason(kind.value), deadline=deadline)
        removed = self._assignment.remove(tps)
        dropped_records = sum(len(owned.buffer) for owned in removed)
        for owned in removed:
            self._metrics.forget_partition(owned.tp)
        if kind == RebalanceKind.REVOKE:
            for owned in removed:
                if time.monotonic() >= deadline:
                    break
                try:
                    self._store.release_partition(self._source, self._worker_id, owned.claim)
                except MetastoreError as exc:
                    # Only the owner column (status) is stale; fencing does not depend on it.
                    log.warning("release_failed", source=self._source, partition=str(owned.tp), error=str(exc))
                    break
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        self._observe(kind, started)
        event = "partitions_revoked" if kind == RebalanceKind.REVOKE else "partitions_lost"
        log.info(
            event,
            source=self._source,
            worker=self._worker_id,
            partitions=[str(tp) for tp in sorted(tps)],
            splits_killed=killed,
            buffered_records_dropped=dropped_records,
            assigned=len(self._assignment),
        )

    def _observe(self, kind: RebalanceKind, started: float) -> None:
        self._metrics.rebalances.labels(self._source, kind).inc()
        self._metrics.rebalance_seconds.labels(self._source, kind).observe(time.monotonic() - started)
        self._metrics.assigned_partitions.labels(self._source).set(len(self._assignment))
