"""Garbage collection of the segment store: the metastore says which segments exist;
files no published segment points to are deleted once older than the grace period.

The grace period must exceed the longest time a split can spend between being built and
being published (retries during a metastore outage included), or gc could delete the
files of a segment that is about to be published.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from ingest.segment_store import delete_dir, list_children
from ingest.spec import SourceSpec
from metastore import Metastore

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 6 * 3600.0
# Below this, gc runs only when told the source's workers are stopped (--force): a shorter
# grace can delete the files of a split that is built and about to be published (Iceberg's
# orphan-file removal draws the same line, at 24 h).
MIN_GRACE_S = 3600.0


@dataclass(frozen=True, slots=True)
class GcResult:
    kept: int
    deleted: list[str]
    too_young: int


def collect_garbage(store: Metastore, spec: SourceSpec, grace_s: float = DEFAULT_GRACE_S,
                    dry_run: bool = False) -> GcResult:
    published = {loc.rstrip("/") for loc in store.published_locations(spec.name)}
    now = time.time()
    kept = too_young = 0
    deleted: list[str] = []
    for uri, mtime in list_children(spec.segment_store, spec.name):
        if uri.rstrip("/") in published:
            kept += 1
        elif now - mtime < grace_s:
            too_young += 1
        else:
            if not dry_run:
                delete_dir(uri)
            deleted.append(uri)
            log.info("gc_deleted", source=spec.name, uri=uri, dry_run=dry_run)
    return GcResult(kept=kept, deleted=deleted, too_young=too_young)
