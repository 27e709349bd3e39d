"""Layout of the segment store and the file operations on it (pyarrow.fs: ``file://``
here, any scheme pyarrow knows elsewhere).

    <store>/<source>/segments/<split-id>/part-*.parquet   data files of one split
    <store>/<source>/rejects/<split-id>/part-*.parquet    its rejected records
    <store>/<source>/_staging/<split-id>.parquet          the records handed to Spark
    <store>/<source>/segments/<batch-id>/                  a batch job's output, moved into
    <store>/<source>/rejects/<batch-id>/                   the split directories right after

Directories are never reused: split and batch ids are fresh UUIDs.
"""

from __future__ import annotations

import uuid

from pyarrow import fs as pafs

_KINDS = ("segments", "rejects")


def _join(store_uri: str, *parts: str) -> str:
    return "/".join([store_uri.rstrip("/"), *parts])


def segment_dir(store_uri: str, source: str, split_id: uuid.UUID) -> str:
    return _join(store_uri, source, "segments", str(split_id))


def rejects_dir(store_uri: str, source: str, split_id: uuid.UUID) -> str:
    return _join(store_uri, source, "rejects", str(split_id))


def staging_file(store_uri: str, source: str, split_id: uuid.UUID) -> str:
    return _join(store_uri, source, "_staging", f"{split_id}.parquet")


def arrow_uri(uri: str) -> str:
    """The URI pyarrow understands for a store URI: Spark's Hadoop S3A connector wants
    ``s3a://bucket/key``, pyarrow names the same objects ``s3://bucket/key``."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    fs, path = pafs.FileSystem.from_uri(arrow_uri(uri))
    return fs, str(path)


def _uri_of(base_uri: str, base_path: str, path: str) -> str:
    return base_uri.rstrip("/") + path[len(base_path.rstrip("/")):]


def ensure_parent(uri: str) -> None:
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)


def list_files(dir_uri: str) -> list[tuple[str, int]]:
    """Data files directly in a directory (hidden ``_``/``.`` files excluded), with sizes."""
    fs, path = filesystem(dir_uri)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(
        (_uri_of(dir_uri, path, info.path), int(info.size or 0))
        for info in infos
        if info.type == pafs.FileType.File and not info.base_name.startswith(("_", "."))
    )


def delete_dir(uri: str) -> None:
    """Delete a directory or a file; missing is fine."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def list_children(store_uri: str, source: str) -> list[tuple[str, float]]:
    """Every split directory and staging file of a source, with its mtime (epoch seconds)."""
    base = _join(store_uri, source)
    fs, base_path = filesystem(base)
    children: list[tuple[str, float]] = []
    for sub in (*_KINDS, "_staging"):
        selector = pafs.FileSelector(f"{base_path}/{sub}", allow_not_found=True)
        for info in fs.get_file_info(selector):
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            children.append((_uri_of(base, base_path, info.path), mtime))
    return sorted(children)


def move_into(uris: list[str], dir_uri: str) -> list[str]:
    """Move files into ``dir_uri`` (created), keeping their names; returns their new URIs.
    A rename on a local or HDFS-like store; a copy and delete on object stores."""
    if not uris:
        return []
    fs, dir_path = filesystem(dir_uri)
    fs.create_dir(dir_path, recursive=True)
    moved = []
    for uri in uris:
        _, path = filesystem(uri)
        name = path.rsplit("/", 1)[-1]
        fs.move(path, f"{dir_path}/{name}")
        moved.append(f"{dir_uri.rstrip('/')}/{name}")
    return moved
