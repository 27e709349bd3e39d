"""The Spark segment builder against a real (local) Spark, reading its splits' offsets from a
real Kafka topic. The module's records are produced once (``produced``); every test reads
ranges of them through splits of its own."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ingest.builder.kafka_read import KafkaReader
from ingest.builder.warm_up import warm_up, warm_up_splits
from ingest.errors import ParseFailure, SplitKilled
from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, OffsetRange
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import Record, produce_blocks, spark_builder, split_of, split_over, values


def make_spec(tmp_path: Path, policy: str = "reject", file_partition: str = "none") -> SourceSpec:
    return spec_from_dict(
        {
            "name": "b",
            "file_partition": file_partition,
            "topics": ["events"],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "on_parse_error": policy,
            "schema": {"id": "long", "ok": "boolean", "ts": "timestamp", "tags": "array<string>", "d": "date"},
        }
    )


def good(i: int) -> bytes:
    return json.dumps(
        {"id": i, "ok": i % 2 == 0, "ts": f"2026-11-22T10:00:{i % 60:02d}Z", "tags": ["x", str(i)], "d": "2026-11-22"}
    ).encode()


def at_hour(i: int) -> bytes:
    """3 hours of event time across 300 records, in offset order."""
    return json.dumps({"id": i, "ts": f"2026-11-22T{10 + i // 100:02d}:{i % 60:02d}:00Z"}).encode()


def wide(i: int) -> bytes:
    """`country` has 8 values, `page` 5,000 (~150 KB of them), `id` one per record."""
    return json.dumps(
        {"id": i, "ts": "2026-11-22T10:00:00Z", "country": f"c{i % 8}", "page": f"/products/{i % 5000:05d}/details"}
    ).encode()


# The module's records: (name, partition, records) of the main topic; OTHER is another topic.
KEYED = [(f"k{i}".encode() if i % 2 else None, good(i)) for i in range(50)]
FAILING = [good(i) for i in range(20)]
FAILING[13], FAILING[17] = b"{broken", None
BLOCKS: list[tuple[str, int, list[Record]]] = [
    ("keyed", 0, KEYED),
    ("failing", 1, values(FAILING)),
    ("a", 2, values([good(i) for i in range(300)])),
    ("b", 2, values([good(i) if i % 10 else b"nope" for i in range(200)])),
    ("d", 2, values([b"{"] * 5)),  # nothing parses
    ("mixed", 3, values([good(1), b"nope", None])),
    ("first500", 4, values([good(i) for i in range(500)])),
    ("next500", 4, values([good(i) for i in range(500)])),
    ("wide", 5, values([wide(i) for i in range(20_000)])),
    ("hours_a", 6, values([at_hour(i) for i in range(300)])),
    ("hours_b", 6, values([at_hour(i) if i % 50 else b"{" for i in range(300)])),
    ("bad_at_7", 7, values([good(i) if i != 7 else b"[1" for i in range(50)])),
]
OTHER = values([good(i) for i in range(100)] + [None])


@pytest.fixture(scope="module")
def produced(kafka_bootstrap: str, make_module_topic: MakeTopic) -> dict[str, OffsetRange]:
    """Every block's offsets; ``c``: the block of another topic, at the same partition number as ``a``."""
    topic, other = make_module_topic(partitions=8, prefix="events"), make_module_topic(partitions=3, prefix="other")
    ranges = produce_blocks(kafka_bootstrap, topic, [(p, records) for _, p, records in BLOCKS])
    [c] = produce_blocks(kafka_bootstrap, other, [(2, OTHER)])
    return {**{name: r for (name, _, _), r in zip(BLOCKS, ranges, strict=True)}, "c": c}


@pytest.fixture
def new_split(produced: dict[str, OffsetRange]) -> Iterator[Any]:
    """A fresh split (its own kill switch) over a named block."""
    yield lambda name: split_over(produced[name])


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def local(uri: str) -> str:
    return uri.removeprefix("file://")


def offsets_in(files: tuple[str, ...]) -> list[int]:
    if not files:
        return []
    return sorted(pq.read_table([local(f) for f in files], columns=["_offset"])["_offset"].to_pylist())


def test_good_rows_round_trip_with_kafka_coordinates_and_types(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    spec = make_spec(tmp_path)
    split: SealedSplit = new_split("keyed")
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split, spec)
    assert (built.row_count, built.rejects_count, built.skipped_count) == (50, 0, 0)
    assert built.min_event_time == datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    assert built.max_event_time == datetime(2026, 11, 22, 10, 0, 49, tzinfo=UTC)
    table = pq.read_table([local(f) for f in built.files])
    assert table.column_names == [
        "_topic",
        "_partition",
        "_offset",
        "_timestamp",
        "_key",
        "id",
        "ok",
        "ts",
        "tags",
        "d",
    ]
    rows = sorted(table.to_pylist(), key=lambda r: r["_offset"])
    assert [r["_offset"] for r in rows] == list(range(split.start, split.end))
    assert [r["id"] for r in rows] == list(range(50))
    assert rows[1]["_topic"] == split.tp.topic and rows[1]["_partition"] == 0 and rows[1]["_key"] == b"k1"
    assert rows[0]["_key"] is None and rows[7]["tags"] == ["x", "7"] and rows[2]["ok"] is True
    assert str(table.schema.field("_timestamp").type) == "timestamp[us, tz=UTC]"
    assert built.size_bytes == sum(Path(local(f)).stat().st_size for f in built.files)
    # What the worker's next cuts estimate from: the keys' and values' bytes as read, and the
    # newest record's Kafka timestamp (the producer's, ms).
    assert built.record_bytes == sum(len(k or b"") + len(v or b"") for k, v in KEYED)
    newest = max(r["_timestamp"] for r in rows)
    assert built.last_timestamp_ms == int(newest.timestamp() * 1000)
    # Only the data files: no _SUCCESS, no .crc.
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(local(f)) for f in built.files)


def test_fail_policy_names_the_first_bad_record_and_leaves_nothing(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    split = new_split("failing")
    with pytest.raises(ParseFailure) as info:
        spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split, make_spec(tmp_path, "fail"))
    assert (info.value.offset, info.value.reason) == (split.start + 13, "invalid_json")
    assert all_files(tmp_path / "store") == []


def test_a_killed_split_raises_and_leaves_no_files(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    split = new_split("keyed")
    split.kill_switch.trip("revoke")
    with pytest.raises(SplitKilled):
        spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split, make_spec(tmp_path))
    assert all_files(tmp_path / "store") == []


def test_builds_from_two_threads_at_once(spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any) -> None:
    spec = make_spec(tmp_path)
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    splits = [new_split("first500"), new_split("next500")]
    results: dict[int, list[int]] = {}

    def run(split: SealedSplit) -> None:
        results[split.start] = offsets_in(builder.build(split, spec).files)

    threads = [threading.Thread(target=run, args=(s,)) for s in splits]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {s.start: list(range(s.start, s.end)) for s in splits}


def test_discard_deletes_data_and_rejects(spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any) -> None:
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(new_split("mixed"), make_spec(tmp_path))
    assert (built.row_count, built.rejects_count) == (1, 2) and built.rejects_files
    segment_store.discard(built)
    assert all_files(tmp_path / "store") == []


@pytest.mark.parametrize("policy", ["reject", "fail"])
def test_warm_up_builds_the_newest_records_and_leaves_nothing(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, produced: dict[str, OffsetRange], new_split: Any, policy: str
) -> None:
    """The warm-up reads the newest records of the partitions that hold the most (the last
    records of partition 2 are bad: under ``fail`` its split stops at one, as a real build does)."""
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    spec = make_spec(tmp_path, policy)
    a, d, keyed = produced["a"], produced["d"], produced["keyed"]
    logs = {a.tp: (a.start, d.end), keyed.tp: (keyed.start, keyed.end)}
    splits = warm_up_splits(logs, records=60, partitions=2)
    assert sorted((s.tp.partition, s.start, s.end) for s in splits) == [(0, 20, 50), (2, d.end - 30, d.end)]
    assert warm_up(builder, spec, splits) > 0
    assert all_files(tmp_path / "store") == []
    # The warmed-up builder (and its cached plan) builds real splits unchanged.
    built = builder.build(new_split("keyed"), spec)
    assert built.row_count == 50


def test_a_batch_builds_each_split_into_its_own_files(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    """Three consecutive splits of one partition (three layers of the read), and a split of
    another topic at the same partition number."""
    spec = make_spec(tmp_path)
    a, b, c, d = (new_split(name) for name in ("a", "b", "c", "d"))
    registrar = RecordingRegistrar()
    built = spark_builder(spark, kafka_bootstrap, registrar).build_batch([a, b, c, d], spec)
    assert all(not isinstance(r, Exception) for r in built), built
    # One build, registered before it wrote anything; every file lies where it registered.
    [build] = registrar.builds
    assert registrar.written_before_registration == [] and build.split_ids == (a.id, b.id, c.id, d.id)
    ra, rb, rc, rd = (r for r in built if isinstance(r, BuiltSegment))
    assert [r.split_id for r in (ra, rb, rc, rd)] == [a.id, b.id, c.id, d.id]
    assert offsets_in(ra.files) == list(range(a.start, a.end)) and ra.rejects_count == 0
    assert offsets_in(rb.files) == [b.start + i for i in range(200) if i % 10] and rb.rejects_count == 20
    assert offsets_in(rb.rejects_files) == [b.start + i for i in range(0, 200, 10)]
    assert rb.parse_errors == (("invalid_json", 20),)
    assert offsets_in(rc.files) == list(range(c.start, c.start + 100)) and rc.parse_errors == (("null_value", 1),)
    assert pq.read_table([local(f) for f in rc.files])["_topic"].unique().to_pylist() == [c.tp.topic]
    assert (rd.files, rd.row_count, rd.rejects_count, rd.min_event_time) == ((), 0, 5, None)
    for r in (ra, rb, rc):
        assert all(f.startswith(r.location + "/") for f in r.files)
        assert r.row_count == len(offsets_in(r.files))
    assert ra.min_event_time == datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    assert ra.max_event_time == datetime(2026, 11, 22, 10, 0, 59, tzinfo=UTC)
    # Nothing but the splits' own files: no empty file of a split without rows, no batch litter.
    published = [f for r in (ra, rb, rc, rd) for f in (*r.files, *r.rejects_files)]
    assert all(registrar.registered(f) for f in published)
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(local(f)) for f in published)


def test_a_batch_of_as_many_splits_at_other_offsets_compiles_no_new_code(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, produced: dict[str, OffsetRange]
) -> None:
    """At equal freshness a job runs every few seconds, over whichever partitions sealed: its
    code must be the previous job's (Spark compiles an expression's code once per distinct
    text; a job that named its offsets compiled, and the JIT recompiled, every stage anew)."""
    spec = make_spec(tmp_path)
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())

    def halves(name: str) -> tuple[SealedSplit, SealedSplit]:
        r = produced[name]
        middle = (r.start + r.end) // 2
        return split_of(r.tp, r.start, middle), split_of(r.tp, middle, r.end)

    (first_a, second_a), (first_b, second_b) = halves("first500"), halves("a")
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    built = builder.build_batch([first_b, first_a], spec)
    assert all(isinstance(r, BuiltSegment) for r in built), built
    before = compiled.getCount()
    built = builder.build_batch([second_a, second_b], spec)
    assert all(isinstance(r, BuiltSegment) for r in built), built
    assert [offsets_in(r.files) for r in built if isinstance(r, BuiltSegment)] == [
        list(range(s.start, s.end)) for s in (second_a, second_b)
    ]
    assert compiled.getCount() == before
    # Other partitions, as many splits: the same code again.
    built = builder.build_batch([split_over(produced["hours_a"]), split_over(produced["keyed"])], spec)
    assert all(isinstance(r, BuiltSegment) for r in built), built
    assert compiled.getCount() == before


def test_a_segment_keeps_dictionaries_only_for_columns_of_few_values(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    # 20,000 records: `country` has 8 values, `page` 5,000 (~150 KB of them, each 4 times),
    # `id` one per record. Parquet's default would dictionary-encode `page` (its 1 MiB
    # dictionary holds them and pays off); a segment gives up on a dictionary past 32 KiB.
    spec = spec_from_dict(
        {
            "name": "d",
            "topics": ["events"],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "schema": {"id": "long", "ts": "timestamp", "country": "string", "page": "string"},
        }
    )
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(new_split("wide"), spec)
    assert built.row_count == 20_000
    dictionary: dict[str, bool] = {}
    for f in built.files:
        meta = pq.ParquetFile(local(f)).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(rg).column(c)
                dictionary[column.path_in_schema] = dictionary.get(column.path_in_schema, False) or (
                    column.has_dictionary_page
                )
    assert dictionary["country"] and dictionary["_topic"], dictionary
    assert not dictionary["page"] and not dictionary["id"] and not dictionary["_offset"], dictionary


def test_file_partition_cuts_each_splits_files_by_hour_of_event_time(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any
) -> None:
    """Every file holds one split's rows of one hour (what an hour-partitioned Iceberg table needs),
    and the rows are all there, each once; rejects are not cut."""
    spec = make_spec(tmp_path, file_partition="hour")
    a, b = new_split("hours_a"), new_split("hours_b")
    ra, rb = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build_batch([a, b], spec)
    assert isinstance(ra, BuiltSegment) and isinstance(rb, BuiltSegment)
    assert offsets_in(ra.files) == list(range(a.start, a.end))
    assert offsets_in(rb.files) == [b.start + i for i in range(300) if i % 50] and rb.rejects_count == 6
    for result in (ra, rb):
        assert len(result.files) == 3 and all(f.startswith(result.location + "/ingest-part=") for f in result.files)
        for f in result.files:
            table = pq.read_table(local(f))
            assert "ingest-part" not in table.column_names
            hours = {ts.hour for ts in table["ts"].to_pylist()}
            assert len(hours) == 1 and f"ingest-part=2026-11-22-{hours.pop()}/" in f
    assert rb.rejects_location is not None
    assert all(f.startswith(rb.rejects_location + "/part-") for f in rb.rejects_files)


def test_one_split_of_a_batch_fails_or_is_killed_and_the_others_build(
    spark: Any, kafka_bootstrap: str, tmp_path: Path, new_split: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec(tmp_path, "fail")
    ok, bad, killed = new_split("keyed"), new_split("bad_at_7"), new_split("first500")
    frame = KafkaReader.frame

    def frame_then_kill(self: KafkaReader, spark: Any, splits: Any) -> Any:
        # Killed once the batch's job is being made: its output is dropped, not the job.
        killed.kill_switch.trip("revoke")
        return frame(self, spark, splits)

    monkeypatch.setattr(KafkaReader, "frame", frame_then_kill)
    r_ok, r_bad, r_killed = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build_batch(
        [ok, bad, killed], spec
    )
    assert isinstance(r_bad, ParseFailure), r_bad
    assert (r_bad.partition, r_bad.offset, r_bad.reason) == (7, bad.start + 7, "invalid_json")
    assert isinstance(r_killed, SplitKilled), r_killed
    assert isinstance(r_ok, BuiltSegment) and offsets_in(r_ok.files) == list(range(ok.start, ok.end))
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(local(f)) for f in r_ok.files)
