"""Fault injection for tests: a committer whose ``INGEST_FAULT_TABLE_PAUSE_AT`` names a point logs
``table_fault_pause`` there and waits until it is killed (what a SIGKILL at that point leaves)."""

from __future__ import annotations

import os
import time
from enum import StrEnum

import structlog

log = structlog.get_logger(__name__)

FAULT_PAUSE_ENV = "INGEST_FAULT_TABLE_PAUSE_AT"


class FaultPoint(StrEnum):
    # An append (or replacement) swapped into the catalog, before the committer records it.
    ICEBERG_COMMITTED = "iceberg_committed"
    # An upsert batch merged into its branch, before the swap that makes it the table.
    UPSERT_STAGED = "upsert_staged"


def pause_if(source: str, point: FaultPoint) -> None:
    if os.environ.get(FAULT_PAUSE_ENV, "") == point.value:
        log.warning("table_fault_pause", source=source, point=point.value)
        while True:
            time.sleep(1)
