"""The serial-guarded publish of one built split, with retries that never publish twice.

The metastore transaction is the real fence (serial + next_offset checks under row
locks). The kill switch is held across it so that once a revoke callback has tripped
the switch, no commit for the split can begin.

A failure says whether a statement of the split went unanswered (``PublishFailed.unanswered``):
the server session of a broken connection goes on and may commit at any time after, so only
a split whose every statement was answered may have its files deleted by the worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Protocol

import structlog

from ingest.errors import PublishFailed, SplitKilled
from ingest.splits.split import SealedSplit
from ingest_common.backoff import METASTORE_BACKOFF, Backoff
from ingest_common.model import BuiltSegment, PublishRange, SegmentToPublish
from metastore.errors import CommitOutcomeUnknown, MetastoreError, MetastoreUnavailable, Session

log = structlog.get_logger(__name__)


class PublishStore(Protocol):
    """The part of ``metastore.Metastore`` the publisher needs."""

    def publish(self, item: SegmentToPublish) -> int: ...
    def end_session(self, session: Session) -> bool: ...
    def segment_for_split(self, split_id: uuid.UUID) -> int | None: ...


class Publisher:
    def __init__(
        self,
        store: PublishStore,
        source: str,
        worker_id: str,
        *,
        backoff: Backoff = METASTORE_BACKOFF,
        on_store_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._store = store
        self._source = source
        self._worker_id = worker_id
        self._backoff = backoff
        self._on_store_error = on_store_error

    def publish(self, split: SealedSplit, segment: BuiltSegment, spec_version: int) -> int:
        """Publish, or raise PublishFailed: its cause is PublishConflict (refused), SplitKilled
        (tripped before a commit could begin) or an unexpected error, and it says whether a
        statement of the split went unanswered (then its files must be left to gc).

        While the metastore is unreachable it retries with capped backoff until it succeeds
        or the split is killed. A commit whose outcome is unknown is resolved by looking the
        split id up before anything is retried, so the split is never published twice; a
        session orphaned by the lost connection may still commit after that lookup, and the
        retry then answers with its segment (the publish is idempotent by split id).
        """
        item = SegmentToPublish(
            source=self._source,
            spec_version=spec_version,
            worker_id=self._worker_id,
            segment=segment,
            ranges=(PublishRange(split.range, split.serial, split.leader_epoch),),
        )
        # Sticky: once a statement went unanswered, no later answer says it will not commit.
        unanswered = False
        for delay in self._backoff.delays():
            try:
                with split.kill_switch.hold():
                    return self._store.publish(item)
            except CommitOutcomeUnknown as exc:
                unanswered = True
                self._report(exc)
                segment_id = self._resolve(split, exc.session)
                if segment_id is not None:
                    return segment_id
            except MetastoreUnavailable as exc:
                # Not sent (no connection), or answered with an error, which rolled it back.
                self._report(exc)
            except (SplitKilled, MetastoreError) as exc:
                # Killed before this attempt was sent, refused, or failed on the server (rolled back).
                raise PublishFailed(exc, unanswered=unanswered) from exc
            except Exception as exc:
                # Unknown where it came from: the statement may have reached the server.
                raise PublishFailed(exc, unanswered=True) from exc
            log.warning(
                "publish_retry",
                split=str(split.id),
                topic=split.tp.topic,
                partition=split.tp.partition,
                retry_in_s=round(delay, 2),
            )
            self._backoff.sleep(delay)
        raise AssertionError("unreachable: the backoff never ends")

    def _resolve(self, split: SealedSplit, session: Session | None) -> int | None:
        """After an unknown commit outcome: was the split published? The answer is final once
        the session the publish was sent on is gone (a connection given up for want of a
        reply leaves it running, or about to receive the publish), so it is ended first.
        Retries until the metastore answers or the split is killed (then the answer no longer
        matters to us: if the commit did land, the offsets advanced and nothing will be
        re-published). Whatever it raises is a PublishFailed with ``unanswered``."""
        for delay in self._backoff.delays():
            if split.kill_switch.tripped:
                raise PublishFailed(SplitKilled(split.kill_switch.reason or "killed"), unanswered=True)
            try:
                if session is not None and not self._store.end_session(session):
                    log.info("publish_session_ending", split=str(split.id), pid=session.pid)
                    self._backoff.sleep(delay)
                    continue
                session = None
                segment_id = self._store.segment_for_split(split.id)
            except MetastoreUnavailable as exc:
                self._report(exc)
                self._backoff.sleep(delay)
                continue
            except Exception as exc:
                raise PublishFailed(exc, unanswered=True) from exc
            log.info("commit_outcome_resolved", split=str(split.id), published=segment_id is not None)
            return segment_id
        raise AssertionError("unreachable: the backoff never ends")

    def _report(self, exc: Exception) -> None:
        log.warning("metastore_error", error=str(exc))
        if self._on_store_error is not None:
            self._on_store_error(exc)
