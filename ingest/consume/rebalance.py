"""Rebalance callbacks: claim on assign, kill on revoke and lost.

- assign: one metastore transaction bumps the serial of every newly assigned partition
  and reads its stored offset (with its leader epoch); splits are then cut from exactly that
  offset, once the broker validated it under that epoch.
  A partition with nothing stored (never read from) first has its start position resolved
  from the log (earliest: its earliest offset, latest: its last stable offset) and stored
  under the claim: the start is resolved once per partition, never again, so repositioning before the
  first publish (a failed split, a re-assignment, a resume) can never skip what was produced
  since.
  The topics' ids (KIP-516) are asked of Kafka before the claim, which records each where the
  partition's row has none (migrations/0027) and returns the stored one: a partition whose
  stored id is not Kafka's is another log now (the topic was deleted and re-created under its
  name) and is stopped at once, before anything validates or cuts it; the gap resolver records
  it (ingest.consume.gaps). Ids Kafka does not give in time are left to the first log-end
  answer (ingest.consume.log_ends): nothing is cut before one confirmed the partition's id.
- revoke / lost: trip the kill switch of every in-flight split of those partitions and
  forget them. Partitions that stay assigned keep everything (their splits in flight too). ``on_lost`` does
  nothing else; ``on_revoke`` also clears the owner in the metastore (status only).
- Everything inside one callback shares one deadline, well under max.poll.interval.ms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import structlog

from ingest.consume.context import ClaimStore, LoopContext
from ingest.consume.kafka import Consumer, KafkaCallFailed, start_offset
from ingest.consume.log_offsets import Watermarks
from ingest.consume.topic_watch import TopicWatch
from ingest_common.backoff import Backoff, Clock
from ingest_common.model import KillReason, PartitionClaim, RebalanceKind, TopicPartition
from metastore.errors import MetastoreError

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Longest a single watermark request may take inside a callback (the deadline bounds them all).
WATERMARK_TIMEOUT_S = 5.0
# Between attempts of a claim (or a start's pin) that failed, while the deadline allows.
CLAIM_RETRY = Backoff.fixed(0.5)


class Deadline:
    """The one time budget of everything a rebalance callback does (claims and their retries,
    kill switches, releases), well under max.poll.interval.ms."""

    def __init__(self, seconds: float, clock: Clock) -> None:
        self._clock = clock
        self._at = clock.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self._at - self._clock.monotonic())

    def expired(self) -> bool:
        return self._clock.monotonic() >= self._at


class RebalanceHandler:
    def __init__(
        self,
        ctx: LoopContext,
        *,
        watermarks: Watermarks,
        deadline_s: float = 30.0,
        claim_retry: Backoff = CLAIM_RETRY,
        topics: TopicWatch | None = None,
    ) -> None:
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._store: ClaimStore = ctx.claims
        self._assignment = ctx.assignment
        self._killer = ctx.killer
        self._validator = ctx.validator
        self._metrics = ctx.metrics
        self._clock = ctx.clock
        self._watermarks = watermarks
        self._deadline_s = deadline_s
        # A pattern source's topics as they come and go (the loop drives its retirements).
        self.topics = topics
        # Waited for on the loop's clock, as the deadline is.
        self._claim_retry = claim_retry.on(ctx.clock)
        # Set when a callback could not do its job; the loop raises it after consume() returns
        # (exceptions raised inside librdkafka callbacks are easy to lose).
        self.error: Exception | None = None

    # -- callbacks -----------------------------------------------------------------

    def on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        started = self._clock.monotonic()
        deadline = Deadline(self._deadline_s, self._clock)
        claims: dict[TopicPartition, PartitionClaim] | None = {}
        if tps and (watch := self.topics) is not None:
            registered = self._retrying(
                "register_topics",
                deadline,
                lambda: watch.register_new({tp.topic for tp in tps}, max(0.1, min(deadline.left(), 5.0))),
            )
            claims = None if registered is None else claims
        ids: dict[str, str | None] = {}
        if tps and claims is not None:
            # Before the claim: an offset pinned after it is then never older than its id.
            ids = self._topic_ids({tp.topic for tp in tps}, deadline)
            claims = self._retrying(
                "claim", deadline, lambda: self._store.claim_partitions(self._source, self._worker_id, tps, ids)
            )
        if claims is not None:
            claims = self._pin_starts(claims, deadline)
        if claims is None:
            # Without a claim the stored offset is unknown: consuming would risk re-reading or
            # skipping, so the worker stops (its partitions move to the others).
            consumer.assign({})
            return
        # A stored position with its leader epoch is validated by the broker before anything is
        # cut from it (KIP-320: ingest.consume.validator, driven by the loop).
        consumer.assign({tp: start_offset(claims[tp]) for tp in tps})
        for claim in claims.values():
            owned = self._assignment.add(claim)
            if claim.next_offset is None or claim.retired:
                # Claimed again by another worker before its start was stored, or its topic was
                # deleted and one of that name is another log (ingest.consume.topic_watch):
                # fenced, it takes nothing until the group moves it (or a reset).
                owned.fence()
            elif (found := ids.get(claim.tp.topic)) is not None and claim.topic_id not in (None, found):
                # The topic was deleted and re-created: its log is not the stored offset's.
                log.warning(
                    "topic_id_changed",
                    source=self._source,
                    partition=str(claim.tp),
                    stored_topic_id=claim.topic_id,
                    topic_id=found,
                    next_offset=claim.next_offset,
                )
                owned.refuse(claim.next_offset)
        self._observe(RebalanceKind.ASSIGN, started)
        log.info(
            "partitions_assigned",
            source=self._source,
            worker=self._worker_id,
            partitions=[f"{c.tp}@{c.next_offset}#{c.serial}" for c in sorted(claims.values(), key=lambda c: c.tp)],
            assigned=len(self._assignment),
        )

    def on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        self._drop(consumer, tps, RebalanceKind.REVOKE)

    def on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        self._drop(consumer, tps, RebalanceKind.LOST)

    # -- internals -----------------------------------------------------------------

    def _pin_starts(
        self, claims: dict[TopicPartition, PartitionClaim], deadline: Deadline
    ) -> dict[TopicPartition, PartitionClaim] | None:
        """Resolve and store the start offset of every claim with nothing stored (None: it
        could not be done within the deadline)."""
        unpinned = [c for c in claims.values() if c.next_offset is None]
        if not unpinned:
            return claims

        def pin() -> dict[TopicPartition, PartitionClaim]:
            pins = []
            for claim in unpinned:
                timeout = max(0.1, min(deadline.left(), WATERMARK_TIMEOUT_S))
                low, high = self._watermarks.watermarks(claim.tp, timeout)
                pins.append((claim, low if claim.initial_position == "earliest" else high))
            return self._store.pin_start_offsets(self._source, pins)

        pinned = self._retrying("pin_start", deadline, pin)
        if pinned is None:
            return None
        for claim in unpinned:
            if claim.tp in pinned:
                log.info(
                    "start_offset_pinned",
                    source=self._source,
                    partition=str(claim.tp),
                    start_from=claim.initial_position,
                    offset=pinned[claim.tp].next_offset,
                )
        return claims | pinned

    def _topic_ids(self, topics: set[str], deadline: Deadline) -> dict[str, str | None]:
        """Kafka's id of each topic, asked once within the deadline; none where Kafka does not
        answer in time (the log-end answers confirm them before anything is cut)."""
        try:
            return self._watermarks.topic_ids(sorted(topics), max(0.1, min(deadline.left(), WATERMARK_TIMEOUT_S)))
        except KafkaCallFailed as exc:
            log.warning("topic_ids_unknown", source=self._source, topics=sorted(topics), error=str(exc))
            return {}

    def _retrying(self, what: str, deadline: Deadline, call: Callable[[], T]) -> T | None:
        """``call`` until it succeeds, retried on metastore and Kafka call failures while the
        deadline allows; None (and ``self.error`` set) once it does not."""
        for delay in self._claim_retry.delays():
            try:
                return call()
            except (MetastoreError, KafkaCallFailed) as exc:
                if isinstance(exc, MetastoreError):
                    self._metrics.metastore_errors.labels(self._source).inc()
                if deadline.left() <= delay:
                    self.error = exc
                    log.error("assign_failed", step=what, source=self._source, worker=self._worker_id, error=str(exc))
                    return None
                log.warning("assign_retry", step=what, source=self._source, worker=self._worker_id, error=str(exc))
                self._claim_retry.sleep(delay)
        raise AssertionError("unreachable: the backoff never ends")

    def _drop(self, consumer: Consumer, tps: list[TopicPartition], kind: RebalanceKind) -> None:
        """Kill what is in flight for the partitions and forget them; ``on_lost`` does nothing
        else (the partitions may already be someone else's)."""
        started = self._clock.monotonic()
        deadline = Deadline(self._deadline_s, self._clock)
        killed = self._killer.kill(tps, KillReason(kind.value), within_s=deadline.left())
        self._validator.forget(tps)
        removed = self._assignment.remove(tps)
        for owned in removed:
            self._metrics.forget_partition(owned.tp)
        if kind == RebalanceKind.REVOKE:
            for owned in removed:
                if deadline.expired():
                    break
                try:
                    self._store.release_partition(self._source, self._worker_id, owned.claim)
                except MetastoreError as exc:
                    # Only the owner column (status) is stale; fencing does not depend on it.
                    log.warning("release_failed", source=self._source, partition=str(owned.tp), error=str(exc))
                    break
        consumer.unassign(tps)
        self._observe(kind, started)
        event = "partitions_revoked" if kind == RebalanceKind.REVOKE else "partitions_lost"
        log.info(
            event,
            source=self._source,
            worker=self._worker_id,
            partitions=[str(tp) for tp in sorted(tps)],
            splits_killed=killed,
            assigned=len(self._assignment),
        )

    def _observe(self, kind: RebalanceKind, started: float) -> None:
        self._metrics.rebalances.labels(self._source, kind).inc()
        self._metrics.rebalance_seconds.labels(self._source, kind).observe(self._clock.monotonic() - started)
        self._metrics.assigned_partitions.labels(self._source).set(len(self._assignment))
