"""The one repositioning path: every reason to move a partition's fetch position (a rewind
after a failed or refused split, an ``ingest reset``, a skipped offset gap, resuming after a
suspend or drain) ends in :meth:`Positioner.reposition`: seek, drop what is buffered, take
records again from there; a seek that fails becomes a rewind, retried with backoff.

A rewind (kafka-delta-ingest's ``reset_state``) kills the partition's in-flight splits, drops
its buffer and, after a backoff, reads the stored offset (in the background) to reposition
there, unless the stored serial moved (another worker owns it: fenced).
"""

from __future__ import annotations

import enum
from functools import partial

import structlog

from ingest.consume.assignment import OwnedPartition, PartitionState
from ingest.consume.context import LoopContext, StateStore
from ingest.consume.kafka import KafkaCallFailed, start_offset
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, StoredPosition, TopicPartition

log = structlog.get_logger(__name__)

# Before a rewind's stored-offset read that failed (the metastore did not answer) is tried again.
READ_RETRY = Backoff.fixed(1.0)


class Reason(enum.StrEnum):
    """Why a partition was repositioned (the ``reason`` of partition_repositioned events)."""

    REWIND = "rewind"
    RESET = "reset"
    GAP_SKIPPED = "gap_skipped"
    RESUME = "resume"


class Positioner:
    def __init__(self, ctx: LoopContext) -> None:
        self._ctx = ctx
        self._source = ctx.source
        self._consumer = ctx.consumer
        self._assignment = ctx.assignment
        self._store: StateStore = ctx.store
        self._clock = ctx.clock

    def reposition(
        self, owned: OwnedPartition, offset: int | None, reason: Reason, leader_epoch: int | None = None
    ) -> bool:
        """Fetch ``owned`` from ``offset`` (None: the claim's start position) and take records
        from there. ``leader_epoch``: that of the record before a stored ``offset``, where known
        (the broker then validates the position). False if the consumer refused: the partition
        is rewinding then."""
        target = offset if offset is not None else start_offset(owned.claim)
        try:
            self._consumer.seek(owned.tp, target, self._positions(), leader_epoch)
        except KafkaCallFailed as exc:
            log.warning(
                "reposition_failed", source=self._source, partition=str(owned.tp), reason=reason, error=str(exc)
            )
            self.rewind(owned)
            return False
        owned.repositioned(offset)
        log.info("partition_repositioned", source=self._source, partition=str(owned.tp), offset=offset, reason=reason)
        return True

    def rewind(self, owned: OwnedPartition) -> None:
        """Stop taking records for the partition, kill its in-flight splits (a later split can
        never publish once an earlier one did not), and re-read the stored offset after a backoff."""
        backoff = owned.rewind(self._clock.monotonic())
        self._ctx.killer.kill([owned.tp], KillReason.REWIND)
        log.warning("partition_rewind_scheduled", source=self._source, partition=str(owned.tp), in_s=backoff)

    def rewinds_due(self, now: float) -> None:
        for owned in self._assignment:
            if owned.rewind_due(now):
                owned.call_started()
                self._ctx.background.submit(
                    partial(self._store.stored_position, self._source, owned.tp),
                    partial(self._stored_offset_read, owned),
                    self._ctx.on_failure(
                        "rewind_read_failed", release=partial(self._read_failed, owned), partition=str(owned.tp)
                    ),
                )

    def _stored_offset_read(self, owned: OwnedPartition, state: StoredPosition | None) -> None:
        owned.call_ended()
        if self._assignment.get(owned.tp) is not owned or owned.state is not PartitionState.REWINDING:
            return  # revoked, re-claimed or fenced meanwhile
        if state is None or state.serial != owned.claim.serial:
            owned.fence()
            log.warning(
                "partition_fenced",
                source=self._source,
                partition=str(owned.tp),
                serial=owned.claim.serial,
                stored_serial=state.serial if state else None,
            )
            return
        epoch = state.leader_epoch if state.next_offset is not None else None
        self.reposition(owned, state.next_offset, Reason.REWIND, epoch)

    def _read_failed(self, owned: OwnedPartition) -> None:
        owned.call_ended(retry_at=self._clock.monotonic() + READ_RETRY.delay(0))

    def _positions(self) -> dict[TopicPartition, int]:
        """Where each owned partition's next record is expected (for an eager re-assignment)."""
        return {
            o.tp: o.buffer.position if o.buffer.position is not None else start_offset(o.claim)
            for o in self._assignment
        }
