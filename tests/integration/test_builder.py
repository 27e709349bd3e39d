"""The Spark segment builder against a real (local) Spark."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ingest.builder.job import SparkSegmentBuilder, warm_up_value
from ingest.errors import ParseFailure, SplitKilled
from ingest.spec import SourceSpec, spec_from_dict
from ingest.splits.chunks import chunks_of
from ingest.splits.split import KillSwitch, SealedSplit, SyntheticRecord
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.fakes import RecordingRegistrar

TP = TopicPartition("events", 3)


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


def split_of(values: list[bytes | None], start: int = 100, tp: TopicPartition = TP) -> SealedSplit:
    records = tuple(SyntheticRecord(start + i, v, f"k{i}".encode() if i % 2 else None) for i, v in enumerate(values))
    return SealedSplit(
        id=uuid.uuid4(),
        tp=tp,
        serial=1,
        start=start,
        end=start + len(values),
        chunks=chunks_of(records),
        size_bytes=sum(len(v or b"") for v in values),
        first_record_at=0.0,
        sealed_at=0.0,
        seal_reason="test",
        kill_switch=KillSwitch(),
    )


def good(i: int) -> bytes:
    return json.dumps(
        {"id": i, "ok": i % 2 == 0, "ts": f"2026-11-22T10:00:{i % 60:02d}Z", "tags": ["x", str(i)], "d": "2026-11-22"}
    ).encode()


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_good_rows_round_trip_with_kafka_coordinates_and_types(spark: Any, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    split = split_of([good(i) for i in range(50)])
    built = SparkSegmentBuilder(spark, RecordingRegistrar()).build(split, spec)
    assert (built.row_count, built.rejects_count, built.skipped_count) == (50, 0, 0)
    assert built.min_event_time == datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    assert built.max_event_time == datetime(2026, 11, 22, 10, 0, 49, tzinfo=UTC)
    table = pq.read_table([f.removeprefix("file://") for f in built.files])
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
    assert [r["_offset"] for r in rows] == list(range(100, 150))
    assert rows[1]["_topic"] == "events" and rows[1]["_partition"] == 3 and rows[1]["_key"] == b"k1"
    assert rows[0]["_key"] is None and rows[7]["tags"] == ["x", "7"] and rows[2]["ok"] is True
    assert str(table.schema.field("_timestamp").type) == "timestamp[us, tz=UTC]"
    assert built.size_bytes == sum(Path(f.removeprefix("file://")).stat().st_size for f in built.files)
    # Only the data files: no _SUCCESS, no .crc, and the staging file is gone.
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(f.removeprefix("file://")) for f in built.files)


def test_fail_policy_names_the_first_bad_record_and_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    values = [good(i) for i in range(20)]
    values[13] = b"{broken"
    values[17] = None
    with pytest.raises(ParseFailure) as info:
        SparkSegmentBuilder(spark, RecordingRegistrar()).build(split_of(values), make_spec(tmp_path, "fail"))
    assert (info.value.offset, info.value.reason) == (113, "invalid_json")
    assert all_files(tmp_path / "store") == []


def test_a_killed_split_raises_and_leaves_no_files(spark: Any, tmp_path: Path) -> None:
    split = split_of([good(i) for i in range(10)])
    split.kill_switch.trip("revoke")
    with pytest.raises(SplitKilled):
        SparkSegmentBuilder(spark, RecordingRegistrar()).build(split, make_spec(tmp_path))
    assert all_files(tmp_path / "store") == []


def trip_once_a_job_runs(spark: Any, switch: KillSwitch, timeout_s: float = 60.0) -> threading.Thread:
    """Trip ``switch`` as soon as Spark reports an active job (the build's), not after a fixed
    delay: how long a build takes depends on the machine."""

    def watch() -> None:
        tracker = spark.sparkContext.statusTracker()
        with contextlib.suppress(TimeoutError):  # then the trip comes before the job: still killed
            wait_until(tracker.getActiveJobsIds, timeout_s, "the build's Spark job", interval=0.005)
        switch.trip("revoke")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_split_killed_while_building_raises_and_leaves_no_files(spark: Any, tmp_path: Path) -> None:
    split = split_of([good(i) for i in range(200_000)])
    watcher = trip_once_a_job_runs(spark, split.kill_switch)
    started = time.monotonic()
    with pytest.raises(SplitKilled):
        SparkSegmentBuilder(spark, RecordingRegistrar()).build(split, make_spec(tmp_path))
    watcher.join(5)
    assert time.monotonic() - started < 30
    assert all_files(tmp_path / "store") == []


def test_builds_from_two_threads_at_once(spark: Any, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    builder = SparkSegmentBuilder(spark, RecordingRegistrar())
    splits = [split_of([good(i) for i in range(500)], start=s) for s in (0, 1000)]
    results: dict[int, int] = {}

    def run(split: SealedSplit) -> None:
        results[split.start] = builder.build(split, spec).row_count

    threads = [threading.Thread(target=run, args=(s,)) for s in splits]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {0: 500, 1000: 500}


def test_discard_deletes_data_and_rejects(spark: Any, tmp_path: Path) -> None:
    builder = SparkSegmentBuilder(spark, RecordingRegistrar())
    built = builder.build(split_of([good(1), b"nope", None]), make_spec(tmp_path))
    assert (built.row_count, built.rejects_count) == (1, 2) and built.rejects_files
    builder.discard(built)
    assert all_files(tmp_path / "store") == []


@pytest.mark.parametrize("policy", ["reject", "fail"])
def test_warm_up_runs_the_build_path_and_leaves_nothing(spark: Any, tmp_path: Path, policy: str) -> None:
    builder = SparkSegmentBuilder(spark, RecordingRegistrar())
    spec = make_spec(tmp_path, policy)
    assert builder.warm_up(spec, records=300, splits=2) > 0
    assert all_files(tmp_path / "store") == []
    # The synthetic value is a good row with every column set: the warm-up takes the parse
    # paths of every type, as real records do.
    typed = builder.build(split_of([warm_up_value(spec)] * 3), spec)
    assert (typed.row_count, typed.rejects_count) == (3, 0)
    rows = pq.read_table([f.removeprefix("file://") for f in typed.files]).to_pylist()
    assert all(row[name] is not None for row in rows for name, _ in spec.schema), rows
    builder.discard(typed)
    # The warmed-up builder (and its cached plan) builds real splits unchanged.
    built = builder.build(split_of([good(1), good(2)]), spec)
    assert built.row_count == 2


def offsets_in(files: tuple[str, ...]) -> list[int]:
    if not files:
        return []
    return sorted(pq.read_table([f.removeprefix("file://") for f in files], columns=["_offset"])["_offset"].to_pylist())


def test_a_batch_builds_each_split_into_its_own_files(spark: Any, tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    other = TopicPartition("other", 3)  # same partition number, another topic
    a = split_of([good(i) for i in range(300)], start=0)
    b = split_of([good(i) if i % 10 else b"nope" for i in range(200)], start=300)  # the next split of TP
    c = split_of([good(i) for i in range(100)] + [None], start=0, tp=other)
    d = split_of([b"{"] * 5, start=500)  # nothing parses: no data files at all
    registrar = RecordingRegistrar()
    built = SparkSegmentBuilder(spark, registrar).build_batch([a, b, c, d], spec)
    assert all(not isinstance(r, Exception) for r in built), built
    # One build, registered before it wrote anything; every file lies where it registered.
    [build] = registrar.builds
    assert registrar.written_before_registration == [] and build.split_ids == (a.id, b.id, c.id, d.id)
    ra, rb, rc, rd = (r for r in built if not isinstance(r, Exception))
    assert [r.split_id for r in (ra, rb, rc, rd)] == [a.id, b.id, c.id, d.id]
    assert offsets_in(ra.files) == list(range(300)) and ra.rejects_count == 0
    assert offsets_in(rb.files) == [300 + i for i in range(200) if i % 10] and rb.rejects_count == 20
    assert offsets_in(rb.rejects_files) == [300 + i for i in range(0, 200, 10)]
    assert rb.parse_errors == (("invalid_json", 20),)
    assert offsets_in(rc.files) == list(range(100)) and rc.parse_errors == (("null_value", 1),)
    assert pq.read_table([f.removeprefix("file://") for f in rc.files])["_topic"].unique().to_pylist() == ["other"]
    assert (rd.files, rd.row_count, rd.rejects_count, rd.min_event_time) == ((), 0, 5, None)
    for r in (ra, rb, rc):
        assert all(f.startswith(r.location + "/") for f in r.files)
        assert r.row_count == len(offsets_in(r.files))
    assert ra.min_event_time == datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    assert ra.max_event_time == datetime(2026, 11, 22, 10, 0, 59, tzinfo=UTC)
    # Nothing but the splits' own files: the batch directories and staging files are gone.
    published = [f for r in (ra, rb, rc, rd) for f in (*r.files, *r.rejects_files)]
    assert all(registrar.registered(f) for f in published)
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(f.removeprefix("file://")) for f in published)


def test_a_segment_keeps_dictionaries_only_for_columns_of_few_values(spark: Any, tmp_path: Path) -> None:
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
    values = [
        json.dumps(
            {"id": i, "ts": "2026-11-22T10:00:00Z", "country": f"c{i % 8}", "page": f"/products/{i % 5000:05d}/details"}
        ).encode()
        for i in range(20_000)
    ]
    built = SparkSegmentBuilder(spark, RecordingRegistrar()).build(split_of(values, start=0), spec)
    assert built.row_count == 20_000
    dictionary: dict[str, bool] = {}
    for f in built.files:
        meta = pq.ParquetFile(f.removeprefix("file://")).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(rg).column(c)
                dictionary[column.path_in_schema] = dictionary.get(column.path_in_schema, False) or (
                    column.has_dictionary_page
                )
    assert dictionary["country"] and dictionary["_topic"], dictionary
    assert not dictionary["page"] and not dictionary["id"] and not dictionary["_offset"], dictionary


def test_file_partition_cuts_each_splits_files_by_hour_of_event_time(spark: Any, tmp_path: Path) -> None:
    """Every file holds one split's rows of one hour (what an hour-partitioned Iceberg table needs),
    and the rows are all there, each once; rejects are not cut."""

    def at(i: int) -> bytes:  # 3 hours of event time across each split, in offset order
        return json.dumps({"id": i, "ts": f"2026-11-22T{10 + i // 100:02d}:{i % 60:02d}:00Z"}).encode()

    spec = make_spec(tmp_path, file_partition="hour")
    a = split_of([at(i) for i in range(300)], start=0)
    b = split_of([at(i) if i % 50 else b"{" for i in range(300)], start=300)
    ra, rb = SparkSegmentBuilder(spark, RecordingRegistrar()).build_batch([a, b], spec)
    assert not isinstance(ra, Exception) and not isinstance(rb, Exception)
    assert offsets_in(ra.files) == list(range(300))
    assert offsets_in(rb.files) == [300 + i for i in range(300) if i % 50] and rb.rejects_count == 6
    for result in (ra, rb):
        assert len(result.files) == 3 and all(f.startswith(result.location + "/ingest-part=") for f in result.files)
        for f in result.files:
            table = pq.read_table(f.removeprefix("file://"))
            assert "ingest-part" not in table.column_names
            hours = {ts.hour for ts in table["ts"].to_pylist()}
            assert len(hours) == 1 and f"ingest-part=2026-11-22-{hours.pop()}/" in f
    assert all(f.startswith(rb.rejects_location + "/part-") for f in rb.rejects_files)


def test_one_split_of_a_batch_fails_or_is_killed_and_the_others_build(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec(tmp_path, "fail")
    ok = split_of([good(i) for i in range(50)], start=0)
    bad = split_of([good(i) if i != 7 else b"[1" for i in range(50)], start=0, tp=TopicPartition("events", 4))
    killed = split_of([good(i) for i in range(50)], start=0, tp=TopicPartition("events", 5))
    builder = SparkSegmentBuilder(spark, RecordingRegistrar())
    stage = builder._stage

    def stage_then_kill(split: SealedSplit, uri: str) -> None:
        stage(split, uri)
        if split is killed:  # killed after the batch started: its output is dropped, not the job
            split.kill_switch.trip("revoke")

    monkeypatch.setattr(builder, "_stage", stage_then_kill)
    r_ok, r_bad, r_killed = builder.build_batch([ok, bad, killed], spec)
    assert isinstance(r_bad, ParseFailure) and (r_bad.partition, r_bad.offset, r_bad.reason) == (4, 7, "invalid_json")
    assert isinstance(r_killed, SplitKilled)
    assert not isinstance(r_ok, Exception) and offsets_in(r_ok.files) == list(range(50))
    assert sorted(all_files(tmp_path / "store")) == sorted(Path(f.removeprefix("file://")) for f in r_ok.files)
