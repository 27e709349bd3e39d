from pathlib import Path

import pytest

from ingest.errors import ConfigError
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common.store_uri import canonical_store_uri, overlap
from tests.unit.test_spec import base


@pytest.mark.parametrize(
    "spelling",
    [
        "/srv/ingest",
        "/srv/ingest/",
        "file:/srv/ingest",
        "file:///srv/ingest",
        "file:///srv/ingest/",
        "local:///srv/ingest",
        "file://localhost/srv/ingest",
        "FILE:///srv/ingest",
    ],
)
def test_every_spelling_of_a_local_store_is_one_uri(spelling: str) -> None:
    assert canonical_store_uri(spelling) == "file:///srv/ingest"


@pytest.mark.parametrize("spelling", ["s3://bucket/a/b", "s3a://bucket/a/b/", "s3n://bucket/a/b", "S3A://bucket/a/b"])
def test_every_spelling_of_an_s3_store_is_one_uri(spelling: str) -> None:
    assert canonical_store_uri(spelling) == "s3a://bucket/a/b"


def test_relative_paths_and_symlinks_resolve_once(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert canonical_store_uri("link/x", base_dir=tmp_path) == f"file://{tmp_path / 'real' / 'x'}"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("/srv/a#b", "'#'"),
        ("file:///srv/a?b=1", "'?'"),
        ("s3a://bucket/a%2Fb", "'%'"),
        ("/srv/../etc", "'..'"),
        ("s3a://bucket/./x", "'.'"),
        ("s3a://bucket/a//b", "empty path segment"),
        ("/srv/store\n", "control characters"),
        ("hdfs://nn/x", "unknown scheme 'hdfs'"),
        ("ftp://host/x", "unknown scheme"),
        ("s3a://bucket", None),
        ("s3a:bucket/x", "s3a://bucket/prefix"),
        ("s3a://Bad_Bucket/x", "bucket name"),
        ("file://host/srv", "no host"),
        ("/", "root"),
        ("", "expected a URI"),
    ],
)
def test_bad_store_uris_get_one_line_naming_the_field(value: str, words: str | None) -> None:
    if words is None:  # a bucket without a prefix is a store
        assert canonical_store_uri(value) == "s3a://bucket"
        return
    with pytest.raises(ConfigError) as caught:
        canonical_store_uri(value)
    message = str(caught.value)
    assert message.startswith("segment_store: ") and words in message and "\n" not in message


@pytest.mark.parametrize(
    "value",
    [
        "s3a://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/x",
        "s3a://wJalrXUtnFEMIsecret@bucket/x",
        "gs://user:wJalrXUtnFEMIsecret@bucket/x",
        "abfss://c:wJalrXUtnFEMIsecret@acct.dfs.core.windows.net/x",
    ],
)
def test_credentials_in_a_store_uri_are_refused_without_printing_them(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^segment_store: ") as caught:
        canonical_store_uri(value)
    assert "wJalrXUtnFEMIsecret" not in str(caught.value)


def test_abfs_container_at_account_is_no_credential() -> None:
    uri = "abfss://data@acct1.dfs.core.windows.net/ingest/"
    assert canonical_store_uri(uri) == "abfss://data@acct1.dfs.core.windows.net/ingest"


def test_overlap_is_by_path_segment() -> None:
    assert overlap("file:///srv/a", "file:///srv/a/b") and overlap("file:///srv/a/b", "file:///srv/a")
    assert overlap("s3a://b/x", "s3a://b/x")
    assert not overlap("file:///srv/a", "file:///srv/ab")
    assert not overlap("s3a://b/x", "gs://b/x")


def test_a_stored_spec_with_an_old_spelling_loads_canonical() -> None:
    doc = spec_from_dict(base()).to_json()
    doc["segment_store"] = "s3://bucket/store/"
    assert SourceSpec.from_json(doc).segment_store == "s3a://bucket/store"
