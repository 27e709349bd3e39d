"""An s3a:// segment store end to end at the build level, against the S3 API the tests
reach (moto's server mode unless INGEST_TEST_S3_ENDPOINT names another): Spark reads the
splits from Kafka and writes through S3A and its magic committer, pyarrow lists, reads and
deletes, and nothing is renamed (on S3 a rename is a copy)."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest

from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_common.model import BuiltSegment, OffsetRange
from ingest_dev.verify import read_coordinates
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic, S3Server
from tests.integration.test_builder import good
from tests.kafka_splits import produce_blocks, spark_builder, split_over, values


@pytest.fixture(scope="module")
def produced(kafka_bootstrap: str, make_module_topic: MakeTopic) -> dict[str, OffsetRange]:
    """``a`` and ``b``: consecutive ranges of one partition; ``c``: another topic's; ``mixed``: 2 good, 1 bad."""
    topic, other = make_module_topic(partitions=2, prefix="events"), make_module_topic(partitions=2, prefix="other")
    a, b, mixed = produce_blocks(
        kafka_bootstrap,
        topic,
        [
            (0, values([good(i) for i in range(300)])),
            (0, values([good(i) if i % 10 else b"nope" for i in range(200)])),
            (1, values([good(1), b"nope", good(2)])),
        ],
    )
    [c] = produce_blocks(kafka_bootstrap, other, [(1, values([good(i) for i in range(50)]))])
    return {"a": a, "b": b, "c": c, "mixed": mixed}


def s3_spec(s3: S3Server, policy: str = "reject") -> SourceSpec:
    return spec_from_dict(
        {
            "name": "s3src",
            "topics": ["events"],
            "event_time": "ts",
            "on_parse_error": policy,
            "segment_store": s3.uri(f"store-{uuid.uuid4().hex[:8]}"),
            "schema": {"id": "long", "ok": "boolean", "ts": "timestamp", "tags": "array<string>", "d": "date"},
        }
    )


def read_offsets(files: tuple[str, ...]) -> list[int]:
    return sorted(offset for f in files for _topic, _partition, offset in read_coordinates(f))


def objects(prefix_uri: str) -> list[str]:
    fs, path = segment_store.filesystem(prefix_uri)
    from pyarrow.fs import FileSelector, FileType

    return sorted(
        i.path
        for i in fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
        if i.type == FileType.File
    )


def test_a_batch_build_on_s3_writes_where_it_registered_and_copies_nothing(
    spark: Any, kafka_bootstrap: str, s3_server: S3Server, produced: dict[str, OffsetRange]
) -> None:
    spec = s3_spec(s3_server)
    a, b, c = (split_over(produced[name]) for name in ("a", "b", "c"))
    registrar = RecordingRegistrar()
    if s3_server.local is not None:
        s3_server.local.record(True)
    try:
        results = spark_builder(spark, kafka_bootstrap, registrar).build_batch([a, b, c], spec)
    finally:
        requests = s3_server.local.requests() if s3_server.local is not None else []
        if s3_server.local is not None:
            s3_server.local.record(False)
    built = [r for r in results if isinstance(r, BuiltSegment)]
    assert len(built) == 3, results
    ra, rb, rc = built
    assert (ra.row_count, rb.row_count, rb.rejects_count, rc.row_count) == (300, 180, 20, 50)
    assert read_offsets(ra.files) == list(range(a.start, a.end))
    assert read_offsets(rb.rejects_files) == [b.start + i for i in range(0, 200, 10)]
    assert len(registrar.builds) == 1  # one build, one Spark job
    published = [f for r in built for f in (*r.files, *r.rejects_files)]
    assert all(f.startswith("s3a://") and registrar.registered(f) for f in published)
    # Only the segments' own files are left: the committer's __magic is gone.
    root = segment_store.source_root(spec.segment_store, spec.name)
    _, bucket_path = segment_store.filesystem(root)
    left = [p.removeprefix(bucket_path.split("/", 1)[0] + "/") for p in objects(root)]
    assert sorted(left) == sorted(segment_store.filesystem(f)[1].split("/", 1)[1] for f in published)
    if s3_server.local is not None:
        assert requests, "the recorder saw no request"
        copies = [r["url"] for r in requests if any(h.lower() == "x-amz-copy-source" for h in r["headers"])]
        assert copies == []
        assert not any("_temporary" in r["url"] for r in requests if r["method"] in ("PUT", "POST"))
        # Spark's output went up as multipart uploads completed at job commit (the magic committer).
        assert any("uploadId=" in r["url"] and r["method"] == "POST" for r in requests)


def test_discard_and_gc_primitives_on_s3(
    spark: Any, kafka_bootstrap: str, s3_server: S3Server, produced: dict[str, OffsetRange]
) -> None:
    spec = s3_spec(s3_server)
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(produced["mixed"]), spec)
    assert built.files and built.rejects_files
    assert (
        pq.read_metadata(
            segment_store.filesystem(built.files[0])[1], filesystem=segment_store.filesystem(built.files[0])[0]
        ).num_rows
        == 2
    )
    segment_store.discard(built)
    assert objects(segment_store.source_root(spec.segment_store, spec.name)) == []


@pytest.mark.parametrize("bad", ["s3a://bucket/a#b", "s3a://key:secret@bucket/a", "s3://bucket/../a"])
def test_bad_s3_store_uris_are_refused(s3_server: S3Server, bad: str) -> None:
    from ingest.errors import ConfigError

    with pytest.raises(ConfigError, match="segment_store"):
        spec_from_dict(
            {"name": "x", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": bad}
        )
