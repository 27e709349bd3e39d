"""What operators ask of a running source, applied by each worker: suspend and drain
(hold: publish what is in flight, cut nothing new), resume, ``ingest reset`` (re-claim the reset
partitions) and a new spec version. The controls come with the registry's heartbeat (or a
NOTIFY that triggered one); the metastore calls they need run in the background.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import structlog

from ingest.consume.context import ControlStore, LoopContext
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.positioning import Positioner, Reason
from ingest.spec.model import SourceSpec
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, PartitionClaim, TopicPartition

log = structlog.get_logger(__name__)

# Before a re-claim or spec load that failed (the metastore did not answer) is tried again.
CONTROL_RETRY = Backoff.fixed(1.0)


class Controls:
    def __init__(self, ctx: LoopContext, *, positioner: Positioner, registry: WorkerRegistry) -> None:
        self._ctx = ctx
        self._source = ctx.source
        self._worker_id = ctx.worker_id
        self._assignment = ctx.assignment
        self._store: ControlStore = ctx.store
        self._specs = ctx.specs
        self._positioner = positioner
        self._registry = registry
        # The reset generation already acted on (None: not known yet; the first one seen
        # triggers a harmless re-claim check).
        self._reset_generation: int | None = None
        self._busy = False
        self._retry_at = 0.0
        self._failed = ctx.on_failure("control_apply_failed", release=self._release)
        self._was_holding = False

    @property
    def holding(self) -> bool:
        """Suspended or draining: publish what is in flight, cut nothing new."""
        return self._registry.desired_state.holding

    def hold_changed(self) -> bool | None:
        """True when a hold began, False when it ended (each partition's cuts go on from where
        they stopped), None when nothing changed."""
        holding = self.holding
        if holding == self._was_holding:
            return None
        self._was_holding = holding
        log.info("consumption_held" if holding else "consumption_resumed", source=self._source, worker=self._worker_id)
        return holding

    def apply(self, now: float) -> None:
        """Start acting on a reset (the reset generation moved) or a new spec version. One
        metastore call at a time, in the background; retried CONTROL_RETRY after an error."""
        control = self._registry.control
        if control is None or self._busy or now < self._retry_at:
            return
        if control.reset_generation != self._reset_generation:
            held = [(owned.tp, owned.claim.serial) for owned in self._assignment]
            self._submit(
                partial(self._store.reclaim_partitions, self._source, self._worker_id, held),
                partial(self._reclaimed, control.reset_generation),
            )
        elif control.spec_version != self._specs.version:
            self._submit(partial(self._store.latest_spec, self._source), self._spec_loaded)

    def _submit(self, call: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self._busy = True
        self._ctx.background.submit(call, done, self._failed)

    def _release(self) -> None:
        self._busy = False
        self._retry_at = self._ctx.clock.monotonic() + CONTROL_RETRY.delay(0)

    def _reclaimed(self, generation: int, claims: dict[TopicPartition, PartitionClaim]) -> None:
        """An ``ingest reset`` bumped the serials of some partitions: everything in flight for
        them belongs to the old epoch and could only be refused. They
        were claimed again (their serial moved once more, fencing anything of ours still in
        flight): drop what is held and reposition at the offset the reset stored. Partitions
        whose serial moved because another worker claimed them are not touched (the metastore
        checks the owner)."""
        self._busy = False
        self._reset_generation = generation
        if not claims:
            log.info("reset_seen", source=self._source, worker=self._worker_id, reclaimed=0)
            return
        killed = self._ctx.killer.kill(claims, KillReason.RESET)
        for tp, claim in claims.items():
            owned = self._assignment.get(tp)
            if owned is None or owned.claim.serial > claim.serial:
                # Revoked meanwhile (the next owner's claim reads the reset offset), or claimed
                # again by an assign after this re-claim (that claim is the newer one).
                continue
            owned.reclaimed(claim)
            self._positioner.reposition(owned, claim.next_offset, Reason.RESET, claim.leader_epoch)
        log.info(
            "partitions_reset",
            source=self._source,
            worker=self._worker_id,
            splits_killed=killed,
            partitions=[f"{c.tp}@{c.next_offset}#{c.serial}" for c in sorted(claims.values(), key=lambda c: c.tp)],
        )

    def _spec_loaded(self, latest: tuple[int, dict[str, Any]]) -> None:
        """A new spec version: splits cut from now on are built and published with it (its
        split limits apply to the next cuts). Consumption does not stop. Topics and the
        consumer group are fixed for the life of a worker: changing them needs a restart."""
        self._busy = False
        version, doc = latest
        spec = SourceSpec.from_json(doc)
        current, previous = self._specs.current()
        if (spec.subscription, spec.group_id) != (current.subscription, current.group_id):
            log.warning(
                "spec_change_needs_restart",
                source=self._source,
                worker=self._worker_id,
                spec_version=version,
                topics=spec.subscription,
                group=spec.group_id,
            )
        self._specs.set(spec, version)
        log.info(
            "spec_version_applied",
            source=self._source,
            worker=self._worker_id,
            spec_version=version,
            previous=previous,
        )
