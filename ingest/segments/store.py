"""Layout of the segment store and the file operations on it (pyarrow.fs: ``file://`` here,
``s3a://``, ``gs://``, ``abfs[s]://`` elsewhere). Store URIs are canonical (ingest/store_uri.py).

    <store>/<source>/segments/<build-id>/part-*.parquet        data files of the build's splits
    <store>/<source>/rejects/<build-id>/part-*.parquet         their rejected records
    <store>/<source>/_staging/<build-id>/                      registered with each build and swept
                                                               by gc, never written: Spark reads the
                                                               records from Kafka (releases that
                                                               staged records wrote there)

A build (one Spark job over a batch of splits) writes into directories of its own, named
by a fresh UUID and registered in the metastore before anything is written. Files stay
where Spark wrote them (no rename: on object stores a rename is a copy); each published
segment lists its own files. What may be deleted is decided by the metastore, never by
listing the store: see ``ingest.ops.gc``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from dataclasses import dataclass

import structlog
from pyarrow import fs as pafs

from ingest_common.model import BuiltSegment

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BuildDirs:
    staging: str
    data: str
    rejects: str


def _join(store_uri: str, *parts: str) -> str:
    return "/".join([store_uri.rstrip("/"), *parts])


def source_root(store_uri: str, source: str) -> str:
    return _join(store_uri, source)


def build_dirs(store_uri: str, source: str, build_id: uuid.UUID) -> BuildDirs:
    return BuildDirs(
        staging=_join(store_uri, source, "_staging", str(build_id)),
        data=_join(store_uri, source, "segments", str(build_id)),
        rejects=_join(store_uri, source, "rejects", str(build_id)),
    )


def arrow_uri(uri: str) -> str:
    """The URI pyarrow understands for a store URI: Spark's Hadoop S3A connector wants
    ``s3a://bucket/key``, pyarrow names the same objects ``s3://bucket/key``."""
    return "s3://" + uri[len("s3a://") :] if uri.startswith("s3a://") else uri


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    fs, path = pafs.FileSystem.from_uri(arrow_uri(uri))
    return fs, str(path)


def _uri_of(base_uri: str, base_path: str, path: str) -> str:
    return base_uri.rstrip("/") + path[len(base_path.rstrip("/")) :]


def exists(uri: str) -> bool:
    """Whether a file is at ``uri`` (OSError when the store cannot say)."""
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type == pafs.FileType.File)


def ensure_parent(uri: str) -> None:
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)


def list_files(dir_uri: str) -> list[tuple[str, int]]:
    """Data files in a directory and its subdirectories (the ``name=value`` levels Spark writes
    for a partitioned write), with sizes. A file with a hidden (``_``/``.``) name, or under a
    hidden directory (Spark's ``_temporary``), is not a data file."""
    fs, path = filesystem(dir_uri)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
    root = path.rstrip("/") + "/"
    return sorted(
        (_uri_of(dir_uri, path, info.path), int(info.size or 0))
        for info in infos
        if info.type == pafs.FileType.File
        and not any(part.startswith(("_", ".")) for part in info.path[len(root) :].split("/"))
    )


class UnsafePath(Exception):
    """A local path goes through a symbolic link: nothing under it is deleted."""


def _check_no_symlink(path: str) -> None:
    """Store roots are resolved when a spec is applied, so a link on the way to a location
    was put there afterwards: deleting through it could reach files that are not ours."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise UnsafePath(f"{current} is a symbolic link")


def delete(uri: str) -> None:
    """Delete what a build wrote: a file, or a directory with everything under it; missing
    is fine. Local paths: symbolic links are never followed (a link is removed, not what
    it points to), and nothing is deleted through a link on the way (UnsafePath)."""
    delete_unlisted(uri, keep=frozenset())


def delete_files(*uris: str) -> None:
    """:func:`delete` each of ``uris`` (files or directories a build wrote); a failure is
    logged and left to gc, which deletes by the metastore's registry whatever stays."""
    for uri in uris:
        try:
            delete(uri)
        except (OSError, UnsafePath) as exc:
            log.warning("cleanup_failed", uri=uri, error=str(exc))


def discard(segment: BuiltSegment) -> None:
    """Delete a built segment's own files (its directories hold other splits' files too)."""
    delete_files(*segment.files, *segment.rejects_files)


def delete_unlisted(location: str, keep: frozenset[str], dry_run: bool = False) -> list[str]:
    """Delete every file under ``location`` (a directory URI) whose URI is not in ``keep``,
    then the directories left empty; returns the URIs deleted (``dry_run``: that would be).
    Same link rules as ``delete``."""
    fs, path = filesystem(location)
    if isinstance(fs, pafs.LocalFileSystem):
        return _delete_local(location, path, keep, dry_run)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        if location in keep:
            return []
        if not dry_run:
            fs.delete_file(path)
        return [location]
    deleted = []
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True)):
        uri = _uri_of(location, path, entry.path)
        if entry.type == pafs.FileType.File and uri not in keep:
            if not dry_run:
                fs.delete_file(entry.path)
            deleted.append(uri)
    if not keep and not dry_run and info.type == pafs.FileType.Directory:
        fs.delete_dir(path)  # object stores: drops a directory marker, if any
    return deleted


def _delete_local(location: str, path: str, keep: frozenset[str], dry_run: bool) -> list[str]:
    _check_no_symlink(os.path.dirname(path.rstrip("/")))
    if os.path.islink(path) or os.path.isfile(path):
        if location in keep:
            return []
        if not dry_run:
            os.unlink(path)
        return [location]
    if not os.path.isdir(path):
        return []
    deleted = []
    # Bottom-up without following links: a link is an entry like a file (removed, never entered).
    for dirpath, dirnames, filenames in os.walk(path, topdown=False, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            uri = _uri_of(location, path, full)
            if uri not in keep:
                if not dry_run:
                    os.unlink(full)
                deleted.append(uri)
        if not dry_run:
            with contextlib.suppress(OSError):  # not empty: it holds files to keep
                os.rmdir(dirpath)
    return deleted


def remove_empty_parents(uri: str, top: str) -> list[str]:
    """After the file at ``uri`` was deleted: remove its parent directories that are empty now,
    nearest first, up to and including ``top`` (a directory above it) and never above; returns
    the URIs removed. Only local stores have directories (an object store's are prefixes of
    its objects' keys): elsewhere nothing to do.

    ``os.rmdir`` only, never a recursive delete: a directory a writer put something into
    meanwhile is not empty and stays, with everything above it; one already gone (another gc)
    is fine. A writer that creates a directory and then a file in it may still find the
    directory gone in between and fail: callers bound ``top`` to directories nobody writes to.
    Same link rules as ``delete``."""
    fs, path = filesystem(uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        return []
    top_path = filesystem(top)[1].rstrip("/")
    current = os.path.dirname(path.rstrip("/"))
    removed: list[str] = []
    while current == top_path or current.startswith(top_path + "/"):
        _check_no_symlink(current)
        try:
            os.rmdir(current)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                break
            raise
        else:
            removed.append(_uri_of(top, top_path, current))
        current = os.path.dirname(current)
    return removed
