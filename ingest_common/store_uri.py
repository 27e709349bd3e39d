"""Segment store URIs, parsed once into one canonical form.

Every spelling of one place becomes one string, so that comparing two stores (overlap at
``source apply``) and two locations (what a registration names) is string comparison:

    /var/lib/ingest, file:/var/lib/ingest, file:///var/lib/ingest/, local:///var/lib/ingest
        -> file:///var/lib/ingest           (absolute, symlinks resolved once, at apply)
    s3://bucket/key, s3n://bucket/key, s3a://bucket/key/
        -> s3a://bucket/key                 (Spark's Hadoop connector; pyarrow maps it back)
    gs://bucket/key, abfs[s]://container@account.dfs.core.windows.net/key -> unchanged

Refused, with one line naming the field: ``#`` and ``?`` (pyarrow cuts the path there, so
staging and cleanup would act on the prefix directory), ``..`` and ``.`` segments, ``%``
escapes, empty segments, control characters, credentials in the URI (they come from the
environment and the usual Hadoop / AWS settings, never from a spec that is stored and
printed), and unknown schemes.
"""

from __future__ import annotations

import re
from pathlib import Path

from ingest_common.errors import ConfigError, shown

_ALIASES = {
    "file": "file",
    "local": "file",
    "s3": "s3a",
    "s3a": "s3a",
    "s3n": "s3a",
    "gs": "gs",
    "abfs": "abfs",
    "abfss": "abfss",
}
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_ABFS_AUTHORITY_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,62}@[a-z0-9]{3,24}\.dfs\.core\.windows\.net")
_FORBIDDEN = {"#": "'#'", "?": "'?'", "%": "'%' escapes", "\\": "'\\'"}
EXAMPLE = "file:///var/lib/ingest/segments or s3a://bucket/prefix"


def canonical_store_uri(value: object, field: str = "segment_store", base_dir: Path | None = None) -> str:
    """The canonical form of a store URI (see the module docstring), or a ConfigError
    naming ``field``. Relative paths are taken from ``base_dir`` (default: the cwd)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field}: expected a URI such as {EXAMPLE}, got {shown(value)}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or value != value.strip():
        raise ConfigError(f"{field}: {shown(value)} contains whitespace or control characters")
    for char, what in _FORBIDDEN.items():
        if char in value:
            raise ConfigError(f"{field}: {what} is not allowed in a store URI, got {shown(value)}")
    match = _SCHEME_RE.fullmatch(value)
    if match is None or len(match.group(1)) == 1:  # a Windows drive letter is no scheme
        return _file_uri(field, value, value, base_dir)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in _ALIASES:
        raise ConfigError(
            f"{field}: unknown scheme {shown(scheme)} in {shown(value)} "
            f"(one of: {', '.join(sorted(_ALIASES))}; plain paths are local files)"
        )
    scheme = _ALIASES[scheme]
    if scheme == "file":
        if rest.startswith("//"):
            authority, _, path = rest[2:].partition("/")
            if authority not in ("", "localhost"):
                raise ConfigError(f"{field}: file URIs name no host (file:///path), got {shown(value)}")
            rest = "/" + path
        if not rest.startswith("/"):
            raise ConfigError(f"{field}: file URIs must be absolute (file:///path), got {shown(value)}")
        return _file_uri(field, rest, value, base_dir)
    if not rest.startswith("//"):
        raise ConfigError(f"{field}: expected {scheme}://bucket/prefix, got {shown(value)}")
    authority, _, path = rest[2:].partition("/")
    _check_authority(field, scheme, authority, value)
    segments = _segments(field, path, value)
    return f"{scheme}://{authority}" + "".join(f"/{s}" for s in segments)


def contains(outer: str, inner: str) -> bool:
    """Whether canonical URI ``inner`` is ``outer`` or lies under it."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def overlap(a: str, b: str) -> bool:
    return contains(a, b) or contains(b, a)


def _file_uri(field: str, path: str, value: str, base_dir: Path | None) -> str:
    _segments(field, path, value)
    p = Path(path)
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    resolved = p.resolve()
    if resolved == Path(resolved.anchor):
        raise ConfigError(f"{field}: the file system root is no store, got {shown(value)}")
    return "file://" + str(resolved)


def _segments(field: str, path: str, value: str) -> list[str]:
    parts = path.split("/")
    inner = parts[1:-1] if path.startswith("/") else parts[:-1]
    for part in parts:
        if part in (".", ".."):
            raise ConfigError(f"{field}: '.' and '..' segments are not allowed in a store URI, got {shown(value)}")
    if any(p == "" for p in inner):
        raise ConfigError(f"{field}: empty path segment ('//') in {shown(value)}")
    return [p for p in parts if p]


def _check_authority(field: str, scheme: str, authority: str, value: str) -> None:
    if scheme in ("abfs", "abfss"):
        # container@account.dfs.core.windows.net: the '@' separates container and account.
        if ":" in authority or not _ABFS_AUTHORITY_RE.fullmatch(authority):
            raise ConfigError(
                f"{field}: expected {scheme}://container@account.dfs.core.windows.net/prefix "
                "(credentials come from the environment, never from the spec), got "
                f"{_without_userinfo(value)!r}"
            )
        return
    if "@" in authority or ":" in authority:
        raise ConfigError(
            f"{field}: credentials or ports in a store URI are not allowed (they come from the "
            "environment and the Hadoop / AWS settings, never from the spec), got "
            f"{_without_userinfo(value)!r}"
        )
    if not _BUCKET_RE.fullmatch(authority) or ".." in authority:
        raise ConfigError(f"{field}: {shown(authority)} is not a valid bucket name in {shown(value)}")


def _without_userinfo(value: str) -> str:
    """``value`` with whatever precedes the last '@' of its authority replaced: the error
    that refuses credentials must not print them."""
    scheme, sep, rest = value.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return scheme + sep + authority + slash + path
