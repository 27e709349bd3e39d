"""Splits cut from offsets: where a partition is read up to, and when its next split is due.

A partition's cutter knows its **position** (where the next split starts: the stored offset it
was positioned at, then each split's end) and what the log-end queries said (ingest.consume.
log_offsets): the last stable offset and since when, at the most, each stretch of offsets past
the position has been in the log: since the previous answer, which did not hold it (the first
answer that holds a stretch comes up to a query interval after its offsets were written; dating
them by that answer would let a split wait ``max_age`` plus that interval). A split is due when
the offsets past the position reach ``max_records``, when their estimated bytes reach
``max_bytes``, or when the oldest of them has waited ``max_age``; it is cut as
``[position, min(position + max_records, last stable offset))``, shortened to the offsets whose
estimate fits ``max_bytes``.

Bytes are estimated, not read: the worker never sees a record. Every published split reports
the bytes of its records' keys and values (ingest.builder.job), and :class:`OffsetSize` keeps
an average of bytes per offset for the partition (each new split weighs half); until the
first split of a partition is built, it assumes ``INITIAL_BYTES_PER_OFFSET``. Offsets without
a record (transaction markers, aborted or compacted records) count as offsets of the average
size: a split of a transactional or compacted topic is estimated larger than it is, never
smaller.

A position known under a leader epoch (a stored offset with its epoch, the end of a cut) is
validated by the broker before anything is cut from it (ingest.consume.validator), and again
whenever a log-end answer names another leader epoch: a new leader may hold a log truncated
below the position (KIP-320).

Invariants: the position only moves forward, by cuts; consecutive cuts tile the offsets;
a cut never ends past the last stable offset the cutter was told; nothing is cut from a
position whose leader epoch changed since it was last validated.
"""

from __future__ import annotations

import uuid
from collections import deque

from ingest.consume.log_offsets import LogEnd
from ingest.spec.model import SplitLimits
from ingest.splits.kill_switch import KillSwitch
from ingest.splits.split import SealedSplit
from ingest_common.model import TopicPartition

# Bytes per offset assumed for a partition none of whose splits was built yet: a typical
# small event (JSON or Avro) with its key.
INITIAL_BYTES_PER_OFFSET = 512


class OffsetSize:
    """The average bytes (keys and values) per offset of one partition."""

    def __init__(self, initial: float = INITIAL_BYTES_PER_OFFSET) -> None:
        self.per_offset = float(initial)
        self.learned = False

    def update(self, record_bytes: int, offsets: int) -> None:
        """A built split of ``offsets`` offsets held ``record_bytes`` bytes of keys and values."""
        if offsets <= 0:
            return
        observed = record_bytes / offsets
        self.per_offset = observed if not self.learned else (self.per_offset + observed) / 2
        self.learned = True

    def of(self, offsets: int) -> int:
        return int(offsets * self.per_offset)

    def offsets_within(self, budget: int) -> int:
        """The most offsets whose estimate stays within ``budget`` (at least one)."""
        return max(1, int(budget / self.per_offset)) if self.per_offset > 0 else budget


class PartitionCutter:
    """One partition's cuts under one claim and generation (a rewind, reset or re-claim makes
    a new cutter: ``epoch`` + 1). Only the polling thread uses it."""

    __slots__ = (
        "_answered_at",
        "_seen",
        "_stable",
        "epoch",
        "leader_epoch",
        "position",
        "position_epoch",
        "serial",
        "topic_id",
        "tp",
        "validated",
        "validating",
    )

    def __init__(
        self,
        tp: TopicPartition,
        serial: int,
        position: int | None,
        epoch: int = 0,
        *,
        position_epoch: int | None = None,
    ) -> None:
        self.tp = tp
        self.serial = serial
        self.epoch = epoch
        # None: nowhere to read from (fenced, or not positioned yet).
        self.position = position
        # The leader epoch the position is known under (stored with it, or the last cut's),
        # and whether the broker confirmed it since it last changed (None: nothing to confirm).
        self.position_epoch = position_epoch
        self.validated = position_epoch is None or position is None
        self.validating = False
        self._stable: int | None = None
        # The leader epoch of the latest log-end answer, and its topic id (the caller takes only
        # answers whose id is the partition's: ingest.consume.log_ends).
        self.leader_epoch: int | None = None
        self.topic_id: str | None = None
        # (last stable offset, the previous answer's time) for each rise seen past the position:
        # how long, at the most, each stretch of offsets has been in the log.
        self._seen: deque[tuple[int, float]] = deque()
        self._answered_at: float | None = None

    @property
    def stable(self) -> int | None:
        """The last stable offset the latest query gave (None: none yet)."""
        return self._stable

    def log_end(self, end: LogEnd, now: float) -> None:
        """A query's answer. A last stable offset below the position is not taken: the caller
        checks :meth:`behind_position` first (the log was truncated or re-created)."""
        since, self._answered_at = self._answered_at, now
        if self.position is not None and end.stable < self.position:
            return
        if self._stable is None or end.stable > self._stable:
            if self.position is not None and end.stable > self.position:
                self._seen.append((end.stable, now if since is None else since))
            self._stable = end.stable
        self.leader_epoch = end.leader_epoch
        self.topic_id = end.topic_id
        if self.validated and self._moved(end.leader_epoch):
            self.validated = False

    def _moved(self, leader_epoch: int | None) -> bool:
        """The partition's leader epoch is not the one the position is known under."""
        return leader_epoch is not None and self.position_epoch is not None and leader_epoch != self.position_epoch

    def needs_validation(self) -> bool:
        """The position must be confirmed by the broker, and no validation is under way."""
        return not self.validated and not self.validating and self.position is not None

    def validation_asked(self) -> tuple[int, int]:
        """The (position, its leader epoch) to validate; the cutter waits for the answer."""
        assert self.position is not None and self.position_epoch is not None
        self.validating = True
        return self.position, self.position_epoch

    def validation_passed(self) -> None:
        """The broker confirmed the position: it is known under the current leader epoch."""
        self.validating = False
        self.validated = True
        if self.leader_epoch is not None:
            self.position_epoch = self.leader_epoch

    def behind_position(self, end: LogEnd) -> bool:
        """The log ends below where this partition was cut to: it lost offsets already cut."""
        return self.position is not None and end.stable < self.position

    def available(self) -> int:
        """Offsets in the log, stable, not cut yet."""
        if self.position is None or self._stable is None:
            return 0
        return max(0, self._stable - self.position)

    def available_since(self) -> float | None:
        """Since when, at the most, the first offset not cut yet has been in the log (None: there
        is none)."""
        return self._seen[0][1] if self.available() and self._seen else None

    def due(self, limits: SplitLimits, size: OffsetSize, now: float) -> str | None:
        """Why the next split is due now, or None (never before the position is validated)."""
        n = self.available()
        if n <= 0 or not self.validated:
            return None
        if n >= limits.max_records:
            return "records"
        if size.of(n) >= limits.max_bytes:
            return "bytes"
        since = self.available_since()
        if since is not None and now - since >= limits.max_age_s:
            return "age"
        return None

    def cut(self, reason: str, limits: SplitLimits, size: OffsetSize, now: float) -> SealedSplit:
        """The next split: at most ``max_records`` offsets and what fits ``max_bytes``."""
        n = min(self.available(), limits.max_records, size.offsets_within(limits.max_bytes))
        assert n > 0 and self.position is not None
        start, end = self.position, self.position + n
        split = SealedSplit(
            id=uuid.uuid4(),
            tp=self.tp,
            serial=self.serial,
            start=start,
            end=end,
            leader_epoch=self.leader_epoch,
            estimated_bytes=size.of(n),
            available_at=self.available_since() or now,
            sealed_at=now,
            seal_reason=reason,
            kill_switch=KillSwitch(),
            epoch=self.epoch,
            topic_id=self.topic_id,
        )
        self.position = end
        if self.leader_epoch is not None:
            self.position_epoch = self.leader_epoch
        # Stretches wholly cut are forgotten. The offsets left of the first stretch partly cut,
        # [end, its stable offset), appeared with it: its time stays theirs.
        while self._seen and self._seen[0][0] <= end:
            self._seen.popleft()
        return split
