"""How one built split is settled on the publish thread: published, or the reason it was not
(an outcome for the polling thread), and what became of its files.

Invariant: files of a split are deleted only when it is certain they were not published and
never will be: every publish statement sent for it was answered. After one went unanswered (a
lost connection) its server session may still commit, however the retries end; the files are
then left to gc (``SplitFiles.LEFT_TO_GC``), which decides by the metastore's split registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from enum import StrEnum

import structlog

from ingest.errors import BuildError, ParseFailure, PublishFailed, SplitKilled, WorkerFailed
from ingest.publish.publisher import Publisher
from ingest.segments import store as segment_store
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, FailureStage, KillReason
from metastore.errors import PublishConflict

log = structlog.get_logger(__name__)


class SplitFiles(StrEnum):
    """What became of the built files of a split that was not published."""

    # Nothing was built (killed or failed before its build finished).
    NONE = "none"
    # Deleted by the worker: no publish of the split was sent, or every one sent was answered
    # with a refusal or an error, so none can ever commit.
    DISCARDED = "discarded"
    # Kept: a publish of the split went unanswered and may have committed, or may commit yet.
    # gc deletes them only if the split never gets published (abandoned after the grace period).
    LEFT_TO_GC = "left_to_gc"


@dataclass(frozen=True, slots=True)
class Published:
    split: SealedSplit
    segment: BuiltSegment
    segment_id: int
    publish_seconds: float


@dataclass(frozen=True, slots=True)
class Killed:
    split: SealedSplit
    reason: str
    files: SplitFiles = SplitFiles.NONE


@dataclass(frozen=True, slots=True)
class Conflicted:
    split: SealedSplit
    conflict: PublishConflict
    files: SplitFiles


@dataclass(frozen=True, slots=True)
class Failed:
    split: SealedSplit
    stage: FailureStage
    error: Exception
    files: SplitFiles = SplitFiles.NONE


@dataclass(frozen=True, slots=True)
class Fatal:
    split: SealedSplit
    error: ParseFailure


Outcome = Published | Killed | Conflicted | Failed | Fatal


# Deletes a built split's files (segment_store.discard; tests record what it is given).
Discard = Callable[[BuiltSegment], None]


@dataclass(frozen=True, slots=True)
class PublishInProgress:
    """The split the publishing thread is publishing, since when (``time.monotonic()``)."""

    split: SealedSplit
    since: float


class Settler:
    def __init__(self, publisher: Publisher, *, discard: Discard | None = None, publish_delay_s: float = 0.0) -> None:
        self._discard = discard or segment_store.discard
        self._publisher = publisher
        self._publish_delay_s = publish_delay_s
        # Read by other threads (ingest.consume.publish_watch): a reference store is atomic.
        self.publishing: PublishInProgress | None = None

    def settle(self, split: SealedSplit, future: Future[BuiltSegment], spec_version: int) -> Outcome:
        """Publish ``split`` once its build resolved, or say why not; its files are disposed
        of by :meth:`_dispose` alone."""
        try:
            built = future.result()
        except (SplitKilled, CancelledError) as exc:
            return Killed(split, exc.reason if isinstance(exc, SplitKilled) else KillReason.SHUTDOWN)
        except ParseFailure as exc:
            return Fatal(split, exc)
        except Exception as exc:
            log.error(
                "build_failed",
                split=str(split.id),
                topic=split.tp.topic,
                partition=split.tp.partition,
                error=str(exc),
                exc_info=not isinstance(exc, BuildError | WorkerFailed),
            )
            return Failed(split, FailureStage.BUILD, exc)
        try:
            if self._publish_delay_s:
                self._sleep_unless_killed(split, self._publish_delay_s)
        except SplitKilled as exc:  # before anything was sent
            return Killed(split, exc.reason, self._dispose(built, unanswered=False))
        started = time.monotonic()
        self.publishing = PublishInProgress(split, started)
        try:
            segment_id = self._publisher.publish(split, built, spec_version)
        except PublishFailed as failed:
            files = self._dispose(built, unanswered=failed.unanswered)
            cause = failed.cause
            if isinstance(cause, SplitKilled):
                return Killed(split, cause.reason, files)
            if isinstance(cause, PublishConflict):
                return Conflicted(split, cause, files)
            log.error("publish_failed", split=str(split.id), files=files, error=str(cause), exc_info=cause)
            return Failed(split, FailureStage.PUBLISH, cause, files)
        except Exception as exc:  # a publisher bug: where the statement got to is unknown
            log.exception("publish_failed", split=str(split.id), files=SplitFiles.LEFT_TO_GC, error=str(exc))
            return Failed(split, FailureStage.PUBLISH, exc, SplitFiles.LEFT_TO_GC)
        finally:
            self.publishing = None
        return Published(split, built, segment_id, time.monotonic() - started)

    def _dispose(self, built: BuiltSegment, *, unanswered: bool) -> SplitFiles:
        """The one place a built split's files are deleted: only when no publish of it can
        ever commit (``unanswered``: a publish statement of it went unanswered)."""
        if unanswered:
            log.warning(
                "split_files_left_to_gc", split=str(built.split_id), files=len(built.files) + len(built.rejects_files)
            )
            return SplitFiles.LEFT_TO_GC
        self._discard(built)
        return SplitFiles.DISCARDED

    @staticmethod
    def _sleep_unless_killed(split: SealedSplit, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (remaining := end - time.monotonic()) > 0:
            split.kill_switch.check()
            time.sleep(min(remaining, 0.05))
