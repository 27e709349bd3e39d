"""Garbage collection of the segment store, decided by the metastore alone.

1. In one transaction, splits of the source still building after the grace period are
   marked abandoned. From its commit on, their publish is refused and counted like a
   conflict (the worker reads the records again): nothing gc deletes can be published
   afterwards, however long a publish was delayed.
2. Then every build of the source that is due is swept: each file under its registered
   directories that no published segment lists is deleted. A build is due when no split of
   it is building, it is not closed, and its last sweep, or its registration if it was never
   swept, is older than the grace period. A sweep that is not the build's first and finds
   nothing to delete closes the build: it is never listed again.
3. Then the files of every segment replaced by compaction (migrations/0017) longer than the
   grace period ago are deleted, each segment once: the files it lists that no current
   segment lists (a replacement carries its old segments' rejects files as they are) and
   that lie under a directory one of the source's builds registered. A reader that listed
   the segment just before its replacement has the grace period to read them. A segment an
   Iceberg table holds waits until the committer took its files out of the table, and one
   grace period more (migrations/0019): readers of the table's previous snapshot. The
   directories those deletions left empty go too (local stores; an object store has none),
   from each file's directory up to the registered build directory holding it, never above
   (the source's and the store's shared levels, where any build may create its directory)
   and never in a build with a split still building. Builds write only under directories of
   their own, registered fresh (a new UUID) before they write, so the one build that could
   write there is the replaced segment's own, and its job completed before that segment was
   published. A directory is removed only when empty (``os.rmdir``): a late writer's file
   keeps it.

Safety: a file is deleted only under a registered directory of one of the source's own
builds, only while no split of that build is building, and never while a published segment
lists it. A split leaves 'building' only for 'published' (its files are kept) or
'abandoned' (its publish is refused), and a registration moves only splits still building;
so nothing gc deletes can be named by a publish that succeeds. Two gc runs never sweep one
build at once (``Metastore.sweep_build`` holds its row).

Completeness: every file in a build's directories that no published segment lists is
deleted unless it is written after the build is closed. A build is swept one grace period
after its registration and again one grace period after each sweep, until a sweep (not the
first) finds nothing. So a file is left only by a writer that writes more than two grace
periods after the build's registration, after a whole grace period in which it left nothing
there. The grace period already assumes a build ends within one (below); the further sweeps
are the margin for writers that break that: a Spark task that outlives its job, a
registration whose reply was lost and that is retried after the first sweep. A retry build
whose splits gc had abandoned (the splits stay with the build they were abandoned in) has no
split at all: its registration alone holds it back for a grace period.

Nothing else is ever deleted: not what another source registered, not what no
registration names (files from before migration 0008, files someone put in the store),
not anything reached through a symbolic link. The store is never listed above a
registered build directory, so object stores (no modification times) work the same.

Object stores: an incomplete multipart upload (a Spark task killed mid-write, an S3A magic
committer job that never committed) is no object, so no listing shows it and gc cannot
delete it; pyarrow's S3 file system cannot list or abort uploads. The bucket's
``AbortIncompleteMultipartUpload`` lifecycle rule removes them (docs/object-storage.md). gc
says so for an ``s3a://`` source, and counts the builds whose sweep found the magic
committer's manifests (``__magic*``): jobs that never committed, whose uploads S3 keeps
until that rule aborts them.

The grace period bounds how long a split may take from registration to publish; a split
older than that is read again, so a too short grace costs work, never records. It should
exceed the longest build plus the longest metastore outage the publisher rides out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog

from ingest.segments.store import UnsafePath, delete_unlisted, remove_empty_parents
from metastore import Metastore

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 6 * 3600.0
# Below this, gc runs only when told so (--force): it would abandon splits still being
# built or published by running workers, which then read their records again.
MIN_GRACE_S = 3600.0
# S3A's magic committer writes its pending-upload manifests under these directories of a
# job's output directory; they outlive only a job that neither committed nor aborted.
MAGIC_PREFIX = "__magic"
MULTIPART_NOTE = (
    "incomplete multipart uploads (killed Spark tasks, uncommitted S3A magic-committer jobs) are "
    "no objects: gc cannot see them; the bucket needs an AbortIncompleteMultipartUpload "
    "lifecycle rule (docs/object-storage.md)"
)


@dataclass(slots=True)
class GcResult:
    abandoned: int = 0
    swept: int = 0
    deleted: list[str] = field(default_factory=list)
    kept: int = 0
    # Registered builds that gc could not sweep (a symbolic link on the way, an I/O error):
    # they stay due and are tried again next time.
    unsafe: list[str] = field(default_factory=list)
    # After this run: builds gc sweeps later (``open``), those of them waiting for a split
    # still building, and those never swept.
    open: int = 0
    building: int = 0
    unswept: int = 0
    # Builds swept now whose directories held S3A magic-committer manifests.
    uncommitted_jobs: int = 0
    # Set for a source on an s3a:// store: what gc cannot see there.
    multipart_note: str | None = None
    # Replaced segments whose files were deleted now, and those whose files wait for their grace.
    replaced: int = 0
    replaced_waiting: int = 0
    # Directories the deletion of replaced segments' files left empty, removed (local stores).
    dirs_removed: list[str] = field(default_factory=list)


def collect_garbage(store: Metastore, source: str, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False) -> GcResult:
    result = GcResult()
    abandoned = store.abandon_stale_splits(source, grace_s, dry_run=dry_run)
    result.abandoned = len(abandoned)
    if abandoned:
        log.warning("gc_abandoned_splits", source=source, splits=len(abandoned), grace_s=grace_s, dry_run=dry_run)
    s3a = str(store.latest_spec(source)[1].get("segment_store", "")).startswith("s3a://")
    for build in store.builds_to_sweep(source, grace_s):
        s3a = s3a or str(build["data"]).startswith("s3a://")
        deleted: list[str] = []
        try:
            sweep = partial(_sweep, source, build, dry_run, deleted)
            if dry_run:
                sweep()
            elif not store.sweep_build(source, build["id"], build["sweeps"], sweep):
                continue  # another gc holds the build, or swept it since it was read
        except (UnsafePath, OSError) as exc:
            result.unsafe.append(f"{build['data']}: {exc}")
            log.error("gc_build_skipped", source=source, build=str(build["id"]), error=str(exc))
            continue
        finally:
            result.deleted.extend(deleted)
        result.kept += len(build["keep"])
        result.swept += 1
        if any(_is_magic(uri, str(build["data"])) for uri in deleted):
            result.uncommitted_jobs += 1
            log.warning("gc_uncommitted_job", source=source, build=str(build["id"]), dry_run=dry_run)
    _delete_replaced(store, source, grace_s, dry_run, result)
    counts = store.build_counts(source)
    result.open, result.building, result.unswept = int(counts["open"]), int(counts["building"]), int(counts["unswept"])
    result.multipart_note = MULTIPART_NOTE if s3a else None
    return result


def _sweep(source: str, build: dict[str, Any], dry_run: bool, deleted: list[str]) -> int:
    """Delete (``dry_run``: only list) what no published segment lists under the build's
    directories: everything under its staging directory, the rest under data and rejects.
    Appends to ``deleted`` as it goes; returns how many it holds."""
    keep = frozenset(build["keep"])
    for location in (build["staging"], build["data"], build["rejects"]):
        for uri in delete_unlisted(location, frozenset() if location == build["staging"] else keep, dry_run):
            log.info("gc_deleted", source=source, build=str(build["id"]), uri=uri, dry_run=dry_run)
            deleted.append(uri)
    return len(deleted)


def _delete_replaced(store: Metastore, source: str, grace_s: float, dry_run: bool, result: GcResult) -> None:
    """Step 3: the files of segments replaced longer than ``grace_s`` ago (the metastore says
    which: never one a current segment lists)."""
    for segment in store.replaced_to_delete(source, grace_s):
        deleted: list[str] = []
        dirs: list[str] = []
        try:
            remove = partial(_delete_files, source, segment, dry_run, deleted, dirs)
            if dry_run:
                remove()
            elif not store.delete_replaced_files(source, int(segment["id"]), remove, grace_s):
                continue  # another gc holds the segment, or deleted its files since it was read
        except (UnsafePath, OSError) as exc:
            result.unsafe.append(f"segment {segment['id']}: {exc}")
            log.error("gc_replaced_skipped", source=source, segment=segment["id"], error=str(exc))
            continue
        finally:
            result.deleted.extend(deleted)
            result.dirs_removed.extend(dirs)
        result.replaced += 1
    pending = int(store.replaced_counts(source)["pending"])
    # A dry run deleted nothing: what it would delete is still pending.
    result.replaced_waiting = max(0, pending - result.replaced) if dry_run else pending


def _delete_files(source: str, segment: dict[str, Any], dry_run: bool, deleted: list[str], dirs: list[str]) -> int:
    for uri in segment["files"]:
        for gone in delete_unlisted(uri, frozenset(), dry_run):
            log.info("gc_deleted", source=source, replaced_segment=segment["id"], uri=gone, dry_run=dry_run)
            deleted.append(gone)
    if dry_run:
        return len(deleted)
    # Once every file is gone: a directory holding several of them empties with the last.
    for uri in deleted:
        top = next((d for d in segment["dirs"] if uri.startswith(d + "/")), None)
        for gone in remove_empty_parents(uri, top) if top is not None else ():
            log.info("gc_removed_dir", source=source, replaced_segment=segment["id"], uri=gone)
            dirs.append(gone)
    return len(deleted)


def _is_magic(uri: str, data_dir: str) -> bool:
    """Whether ``uri`` lies under an S3A magic-committer directory of the build's data directory."""
    rest = uri[len(data_dir) + 1 :] if uri.startswith(data_dir + "/") else ""
    return any(part.startswith(MAGIC_PREFIX) for part in rest.split("/"))
