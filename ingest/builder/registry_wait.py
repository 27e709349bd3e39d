"""Splits waiting for the schema registry: which partitions they hold back, since when, and
the registry's last error. The build queue's threads write it (a split whose build found
the registry not answering waits, one that resolved in any way stops waiting); the polling
thread reads it (ingest.consume.registry_watch) to pause those partitions and report why.

A wait is not a failure: nothing is rejected, skipped or rewound for it, and it lasts as long
as the registry does not answer.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import structlog

from ingest.splits.split import SealedSplit
from ingest_common.backoff import Clock
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class RegistryWait:
    """The partitions with a split waiting for the registry, for how long the oldest wait has
    lasted, the registry's last error and the retries made so far."""

    partitions: tuple[TopicPartition, ...]
    waited_s: float
    error: str
    retries: int


class RegistryWaits:
    """Safe from every thread."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # Split id -> (its partition, when it began to wait).
        self._splits: dict[uuid.UUID, tuple[TopicPartition, float]] = {}
        self._error = ""
        self._retries = 0

    def waiting(self, split: SealedSplit, error: Exception, *, retry: int, retry_in_s: float) -> None:
        """The split's build found the registry not answering (again): it is built again in
        ``retry_in_s``, its ``retry``-th retry."""
        with self._lock:
            self._splits.setdefault(split.id, (split.tp, self._clock.monotonic()))
            self._error = str(error)
            self._retries += 1
        log.warning(
            "build_waits_for_schema_registry",
            split=str(split.id),
            topic=split.tp.topic,
            partition=split.tp.partition,
            retry=retry,
            retry_in_s=retry_in_s,
            error=str(error),
        )

    def resolved(self, split_id: uuid.UUID) -> None:
        """The split is no longer waiting (built, failed for another reason, killed)."""
        with self._lock:
            self._splits.pop(split_id, None)
            if not self._splits:
                self._retries = 0

    def current(self) -> RegistryWait | None:
        with self._lock:
            if not self._splits:
                return None
            since = min(at for _, at in self._splits.values())
            tps = sorted({tp for tp, _ in self._splits.values()}, key=lambda tp: (tp.topic, tp.partition))
            return RegistryWait(tuple(tps), max(0.0, self._clock.monotonic() - since), self._error, self._retries)
