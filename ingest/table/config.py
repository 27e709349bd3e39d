"""The table's settings: partition transform, where rejects go, how commits are batched. No
pyiceberg here: the CLI's parser imports this module on every command."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ingest.config import TABLE_PASS_DEADLINE_S
from ingest_common.backoff import Backoff
from ingest_common.errors import ConfigError
from ingest_common.model import PartitionBy

__all__ = ["CommitSettings", "PartitionBy", "RejectsMode"]

DEFAULT_BATCH_SEGMENTS = 100
DEFAULT_INTERVAL_S = 10.0
# Snapshots a table keeps (older ones are expired after each commit): pyiceberg copies the whole
# metadata, every snapshot included, many times per commit, so an unbounded snapshot list makes
# each commit slower than the last (docs/iceberg.md, the commit costs).
DEFAULT_KEEP_SNAPSHOTS = 25
# A committer whose every pass has failed this long reports itself unhealthy (/healthz 503):
# long past a PostgreSQL restart or failover, short of an alert's patience.
DEFAULT_UNHEALTHY_AFTER_S = 60.0
# A segment the table refused (its files, not an outage: ingest.table.refusals) is tried again,
# alone, after 10 s, 20 s, 40 s, ... at most every 10 minutes; each try reads its files' footers.
REFUSED_RETRY = Backoff(10.0, 600.0)


class RejectsMode(StrEnum):
    TABLE = "table"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class CommitSettings:
    # A commit appends at most this many segments, and this many pending start one at once.
    batch_segments: int = DEFAULT_BATCH_SEGMENTS
    # Otherwise pending segments wait at most this long for a commit.
    interval_s: float = DEFAULT_INTERVAL_S
    # How often the committer looks for pending segments.
    poll_s: float = 1.0
    # Snapshots kept for time travel; older ones are expired (metadata only: no file is deleted).
    keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS
    # Catalog conflicts retried within one commit before it is given up (and tried next pass).
    max_attempts: int = 5
    # Failing passes (or no pass ending) for longer than this make /healthz answer 503.
    unhealthy_after_s: float = DEFAULT_UNHEALTHY_AFTER_S
    # A pass that goes this long without a commit attempt ending has its lock released and
    # makes /healthz answer 503 (ingest.roles.runner; INGEST_TABLE_PASS_DEADLINE_S).
    pass_deadline_s: float = TABLE_PASS_DEADLINE_S
    # When a segment the table refused is tried again (its clock: when it is due).
    refused_retry: Backoff = REFUSED_RETRY

    def __post_init__(self) -> None:
        if not 1 <= self.batch_segments <= 1000:
            raise ConfigError(f"--batch-segments: expected 1 to 1000, got {self.batch_segments}")
        if not 1 <= self.keep_snapshots <= 100_000:
            raise ConfigError(f"--keep-snapshots: expected 1 to 100000, got {self.keep_snapshots}")
        if not self.interval_s >= 0:
            raise ConfigError(f"--interval: expected a non-negative number of seconds, got {self.interval_s}")
        if not 0 < self.pass_deadline_s < math.inf:
            raise ConfigError(
                f"INGEST_TABLE_PASS_DEADLINE_S: expected a positive number of seconds, got {self.pass_deadline_s}"
            )
        if not self.unhealthy_after_s > 0:
            raise ConfigError(f"unhealthy_after_s: expected a positive number of seconds, got {self.unhealthy_after_s}")
