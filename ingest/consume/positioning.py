"""The one repositioning path: every reason to move where a partition's splits are cut from
(a rewind after a failed or refused split, an ``ingest reset``, a skipped offset gap) ends in
:meth:`Positioner.reposition`: cut from there in a new generation, once the broker validated
the position under its stored leader epoch (KIP-320, ingest.consume.validator). The group
member's own position is never moved: it reads nothing.

A rewind (kafka-delta-ingest's ``reset_state``) kills the partition's in-flight splits, stops
cutting and, after a backoff, reads the stored offset (in the background) to reposition there,
unless the stored serial moved (another worker owns it: fenced). The stored offset is read
after the kill: a publish that held a split's switch past the kill's bound may still commit
after the read, and then the splits cut from the older offset are refused (offset mismatch)
and the partition rewinds again; the position it then reads carries that publish's leader
epoch, so a truncation below it is still found.
"""

from __future__ import annotations

import enum
from functools import partial

import structlog

from ingest.consume.assignment import OwnedPartition, PartitionState
from ingest.consume.context import LoopContext, StateStore
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, StoredPosition

log = structlog.get_logger(__name__)

# Before a rewind's stored-offset read that failed (the metastore did not answer) is tried again.
READ_RETRY = Backoff.fixed(1.0)


class Reason(enum.StrEnum):
    """Why a partition was repositioned (the ``reason`` of partition_repositioned events)."""

    REWIND = "rewind"
    RESET = "reset"
    GAP_SKIPPED = "gap_skipped"


class Positioner:
    def __init__(self, ctx: LoopContext) -> None:
        self._ctx = ctx
        self._source = ctx.source
        self._validator = ctx.validator
        self._assignment = ctx.assignment
        self._store: StateStore = ctx.store
        self._clock = ctx.clock

    def reposition(
        self, owned: OwnedPartition, offset: int | None, reason: Reason, leader_epoch: int | None = None
    ) -> None:
        """Cut ``owned`` from ``offset`` (None: nowhere: the claim could not pin a start).
        ``leader_epoch``: the one stored with ``offset``, where known: the broker validates the
        position before anything is cut (ingest.consume.validator)."""
        self._validator.forget([owned.tp])
        owned.repositioned(offset, leader_epoch)
        log.info(
            "partition_repositioned",
            source=self._source,
            partition=str(owned.tp),
            offset=offset,
            leader_epoch=leader_epoch,
            reason=reason,
        )

    def rewind(self, owned: OwnedPartition) -> None:
        """Stop cutting the partition, kill its in-flight splits (a later split can never
        publish once an earlier one did not), and re-read the stored offset after a backoff."""
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
        owned.topic_id = state.topic_id
        self.reposition(owned, state.next_offset, Reason.REWIND, epoch)

    def _read_failed(self, owned: OwnedPartition) -> None:
        owned.call_ended(retry_at=self._clock.monotonic() + READ_RETRY.delay(0))
