"""Garbage collection of the segment store, decided by the metastore alone.

1. In one transaction, splits of the source still building after the grace period are
   marked abandoned. From its commit on, their publish is refused and counted like a
   conflict (the worker reads the records again): nothing gc deletes can be published
   afterwards, however long a publish was delayed.
2. Then, for each build of the source that has no split left building and was not swept
   yet: every file under its registered directories that no published segment lists is
   deleted, and the build is marked swept.

Nothing else is ever deleted: not what another source registered, not what no
registration names (files from before migration 0008, files someone put in the store),
not anything reached through a symbolic link. The store is never listed above a
registered build directory, so object stores (no modification times) work the same.

The grace period bounds how long a split may take from registration to publish; a split
older than that is read again, so a too short grace costs work, never records. It should
exceed the longest build plus the longest metastore outage the publisher rides out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from ingest.build.segment_store import UnsafePath, delete_unlisted
from metastore import Metastore

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 6 * 3600.0
# Below this, gc runs only when told so (--force): it would abandon splits still being
# built or published by running workers, which then read their records again.
MIN_GRACE_S = 3600.0


@dataclass(slots=True)
class GcResult:
    abandoned: int = 0
    swept: int = 0
    deleted: list[str] = field(default_factory=list)
    kept: int = 0
    # Registered builds that gc could not sweep (a symbolic link on the way, an I/O error):
    # they stay unswept and are tried again next time.
    unsafe: list[str] = field(default_factory=list)
    unswept: int = 0


def collect_garbage(store: Metastore, source: str, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False) -> GcResult:
    result = GcResult()
    abandoned = store.abandon_stale_splits(source, grace_s, dry_run=dry_run)
    result.abandoned = len(abandoned)
    if abandoned:
        log.warning("gc_abandoned_splits", source=source, splits=len(abandoned), grace_s=grace_s, dry_run=dry_run)
    for build in store.builds_to_sweep(source):
        keep = frozenset(build["keep"])
        result.kept += len(keep)
        try:
            for location in (build["staging"], build["data"], build["rejects"]):
                deleted = delete_unlisted(location, frozenset() if location == build["staging"] else keep, dry_run)
                result.deleted.extend(deleted)
                for uri in deleted:
                    log.info("gc_deleted", source=source, build=str(build["id"]), uri=uri, dry_run=dry_run)
        except (UnsafePath, OSError) as exc:
            result.unsafe.append(f"{build['data']}: {exc}")
            log.error("gc_build_skipped", source=source, build=str(build["id"]), error=str(exc))
            continue
        if not dry_run:
            store.mark_swept(source, build["id"])
        result.swept += 1
    result.unswept = store.build_counts(source)[0]
    return result
