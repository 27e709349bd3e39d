"""How the build reads its splits' exact offset ranges from a real Kafka (ingest.builder.kafka_read)
and accounts for every record it read (ingest.builder.accounting), with real Spark: consecutive
splits of a partition in one batch, a record read outside its split's range, transactions
(aborted, and one still open past the last stable offset) and a compacted log's holes recorded
per segment, offsets gone from the log, and a kill switch tripped while the job reads."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ingest.builder.job import BuildResult, SparkSegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.consume.log_offsets import AdminLogOffsets, LogEnd
from ingest.errors import BuildError, SplitKilled
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, OffsetRange, TopicPartition
from ingest_dev.testkit import wait_until
from tests.acceptance.test_apache_kafka import topic_configs_setter
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import Record, produce_blocks, reader, spark_builder, split_of, split_over, values


def make_spec(tmp_path: Path, policy: str = "reject") -> SourceSpec:
    return spec_from_dict(
        {
            "name": "k",
            "topics": ["t"],
            "event_time": "ts",
            "segment_store": str(tmp_path / "store"),
            "on_parse_error": policy,
            "schema": {"id": "long", "ts": "timestamp"},
        }
    )


def value(i: int) -> bytes:
    return json.dumps({"id": i, "ts": f"2026-11-22T10:{i // 60 % 60:02d}:{i % 60:02d}Z"}).encode()


def log_end(bootstrap: str, tp: TopicPartition, isolation: IsolationLevel | None = None) -> LogEnd:
    """The partition's last stable offset and earliest offset, asked as the worker asks them
    (``isolation`` READ_UNCOMMITTED: its ``stable`` is the high watermark)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until answered
    if isolation is not None:
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        [future] = admin.list_offsets({ktp: OffsetSpec.latest()}, isolation_level=isolation).values()
        return LogEnd(int(future.result(timeout=10).offset), None, -1)
    query = AdminLogOffsets(admin).query([tp])
    assert query.wait(10)
    ends, errors = query.result()
    assert not errors, errors
    return ends[tp]


def settled(bootstrap: str, tp: TopicPartition, past: int) -> LogEnd:
    """The partition's log once a transaction's records up to offset ``past`` are decided: its
    markers are written after its commit (or abort) returned, and the last stable offset
    reaches the log's end once they are."""

    def decided() -> LogEnd | None:
        end = log_end(bootstrap, tp)
        high = log_end(bootstrap, tp, IsolationLevel.READ_UNCOMMITTED).stable
        return end if end.stable == high and end.stable > past else None

    return wait_until(decided, 30, f"the last stable offset of {tp} to pass {past}", interval=0.05)


def read(files: tuple[str, ...], columns: list[str]) -> list[dict[str, Any]]:
    if not files:
        return []
    table = pa.concat_tables([pq.read_table(f.removeprefix("file://"), columns=columns) for f in files])
    return sorted(table.to_pylist(), key=lambda r: r["_offset"])


def built(results: list[BuildResult]) -> list[BuiltSegment]:
    assert all(isinstance(r, BuiltSegment) for r in results), results
    return [r for r in results if isinstance(r, BuiltSegment)]


# --------------------------------------------------------------------------- accounting


def mixed(n: int, seed: int) -> list[Record]:
    """Keyed records, every 3rd (shifted by seed) bad, some keys null."""
    return [
        (None if i % 4 == 0 else f"key-{seed}-{i}".encode(), b"{" if (i + seed) % 3 == 0 else value(seed * 1000 + i))
        for i in range(n)
    ]


def test_every_record_of_each_split_is_a_row_a_reject_or_skipped(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A batch of splits of several partitions, two of them consecutive splits of one partition
    (two layers of the read): per split, rows + rejects + skipped == the records of its range,
    each record in its own split's files, with its range's bytes and newest timestamp."""
    topic = make_topic(partitions=3)
    blocks = [(0, mixed(40, 1)), (0, mixed(25, 2)), (1, mixed(30, 3)), (2, values([value(i) for i in range(20)]))]
    ranges = produce_blocks(kafka_bootstrap, topic, blocks)
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    rejected = built(builder.build_batch([split_over(r) for r in ranges], make_spec(tmp_path / "r")))
    skipped = built(builder.build_batch([split_over(r) for r in ranges], make_spec(tmp_path / "s", "skip")))
    for (_, records), offsets, r, s in zip(blocks, ranges, rejected, skipped, strict=True):
        bad = sum(1 for _, v in records if v == b"{")
        assert (r.row_count, r.rejects_count, r.skipped_count) == (len(records) - bad, bad, 0), offsets
        assert (s.row_count, s.rejects_count, s.skipped_count) == (len(records) - bad, 0, bad), offsets
        assert r.records == s.records == offsets.end - offsets.start
        assert r.holes == s.holes == 0
        rows = read(r.files, ["_offset", "_timestamp"])
        rejects = read(r.rejects_files, ["_offset", "_timestamp"])
        everything = list(range(offsets.start, offsets.end))
        assert sorted(x["_offset"] for x in rows + rejects) == everything
        assert [x["_offset"] for x in read(s.files, ["_offset"])] == [x["_offset"] for x in rows]
        assert r.record_bytes == s.record_bytes == sum(len(k or b"") + len(v or b"") for k, v in records)
        newest = max(x["_timestamp"] for x in rows + rejects)
        assert r.last_timestamp_ms == s.last_timestamp_ms == int(newest.timestamp() * 1000)


# --------------------------------------------------------------------------- a split's range


def misreading(start: int, end: int, times: int = 1) -> Callable[..., Any]:
    """``KafkaReader.frame`` reading each split's range with its bounds moved by ``start`` and
    ``end``, ``times`` over, as a reader returning records outside the split's range (or some
    twice) would; each row keeps its split's index."""
    frame = KafkaReader.frame

    def read(self: KafkaReader, spark: Any, splits: Sequence[SealedSplit]) -> Any:
        moved = [replace(s, start=s.start + start, end=s.end + end) for s in splits]
        frames = [frame(self, spark, moved) for _ in range(times)]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    return read


@pytest.mark.parametrize(
    ("start", "end", "times", "read"),
    [
        (-1, 0, 1, "read offsets {start_1}..{last}, outside its range"),
        (1, 1, 1, "read offsets {start1}..{end}, outside its range"),
        (0, 0, 2, "read 40 records (38 rows, 2 bad), more than its 20 offsets"),
    ],
    ids=["one-before-start", "one-at-end", "each-twice"],
)
def test_a_split_that_reads_outside_its_range_or_too_much_fails_the_build_with_one_line(
    spark: Any,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start: int,
    end: int,
    times: int,
    read: str,
) -> None:
    """Spark reads an offset outside the split's range, or each of its records twice; the odd
    ones out are bad records (under ``skip`` the rows and the bad ones still add up to what
    the job read): the split fails with one line naming it, its range and what it read, and
    nothing is left in the store."""
    records = [b"{", *(value(i) for i in range(19)), b"{", b"{", *(value(i) for i in range(19, 28))]
    offsets = produce_blocks(kafka_bootstrap, make_topic(partitions=1), [(0, values(records))])[0]
    split = split_of(offsets.tp, offsets.start + 1, offsets.start + 21)  # 19 good records, then a bad one
    monkeypatch.setattr(KafkaReader, "frame", misreading(start, end, times))
    [result] = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build_batch(
        [split], make_spec(tmp_path, "skip")
    )
    assert isinstance(result, BuildError), result
    what = read.format(start_1=split.start - 1, last=split.end - 1, start1=split.start + 1, end=split.end)
    line = f"split {split.id} of {split.tp} [{split.start}, {split.end}) {what}"
    assert line in str(result) and "\n" not in str(result), str(result)
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []


# --------------------------------------------------------------------------- transactions


def test_aborted_records_are_never_read_and_an_open_transaction_is_not_waited_for(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Three splits cut at the last stable offset after each transaction (committed, aborted,
    committed: each range ends on its marker), the last one ending where a transaction still
    open begins: the aborted records are in no file, the split of the aborted transaction has
    no record at all, and the build reads to the end of the last split without waiting for
    the open transaction (Spark's reader waits ``pollTimeoutMs``, 30 s, for an offset it cannot read)."""
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 5})
    producer.init_transactions(30)
    cuts: list[LogEnd] = []
    for first, commit in ((0, True), (100, False), (10, True), (200, None)):
        producer.begin_transaction()
        for i in range(first, first + 10):
            producer.produce(topic, value=value(i), partition=0)
        producer.flush(30)
        if commit is None:
            break  # left open
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        cuts.append(settled(kafka_bootstrap, tp, past=cuts[-1].stable + 9 if cuts else 9))
    try:
        end = log_end(kafka_bootstrap, tp)
        assert end.stable == cuts[-1].stable, "the open transaction moved the last stable offset"
        assert log_end(kafka_bootstrap, tp, IsolationLevel.READ_UNCOMMITTED).stable == end.stable + 10
        starts = [0, *(c.stable for c in cuts[:-1])]
        splits = [split_of(tp, s, c.stable, c.leader_epoch) for s, c in zip(starts, cuts, strict=True)]
        started = time.monotonic()
        results = built(
            spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build_batch(splits, make_spec(tmp_path))
        )
        took = time.monotonic() - started
    finally:
        producer.abort_transaction(30)
    committed, aborted, again = results
    print(f"the build took {took:.2f} s")
    assert took < 15, f"the build took {took:.1f} s"
    assert [r["id"] for r in read(committed.files, ["_offset", "id"])] == list(range(10))
    assert (aborted.records, aborted.files) == (0, ())
    assert [r["id"] for r in read(again.files, ["_offset", "id"])] == list(range(10, 20))
    assert [r.records for r in results] == [10, 0, 10]
    # Each commit's marker, and the aborted transaction's 10 records and its marker.
    assert [r.holes for r in results] == [1, 11, 1]


# --------------------------------------------------------------------------- compaction


def surviving_offsets(bootstrap: str, tp: TopicPartition) -> list[int]:
    """The offsets a consumer reads from the partition's start to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "probe", "enable.auto.commit": False, "enable.partition.eof": True}
    )
    consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, 0)])
    offsets: list[int] = []

    def at_the_end() -> bool:
        msg = consumer.poll(1.0)
        if msg is None:
            return False
        if msg.error() is not None:
            return True  # the end of the partition
        offsets.append(int(msg.offset() or 0))
        return False

    try:
        wait_until(at_the_end, 20, f"the end of {tp}", interval=0)
    finally:
        consumer.close()
    return offsets


def test_a_compacted_logs_holes_inside_ranges_are_no_data_loss(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Offsets the log cleaner removed, inside a split, at its end and making up a whole split:
    each split's rows are exactly the records left in its range, and none fails."""
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    set_configs = topic_configs_setter(kafka_bootstrap, topic)
    # Small, quickly rolled segments that the cleaner compacts as soon as it may.
    set_configs(
        cleanup_policy="compact",
        segment_ms="100",
        min_cleanable_dirty_ratio="0.001",
        min_compaction_lag_ms="0",
        delete_retention_ms="0",
    )
    for batch in range(6):  # 10 keys rewritten 15 times and 5 keys of each batch's own, rolling segments
        keys = [f"k{i % 10}" if i < 25 else f"own-{batch}-{i}" for i in range(30)]
        produce_blocks(kafka_bootstrap, topic, [(0, [(k.encode(), value(batch * 30 + i)) for i, k in enumerate(keys)])])
        time.sleep(0.2)
    wait_until(lambda: len(surviving_offsets(kafka_bootstrap, tp)) < 120, 60, "the log cleaner to compact", interval=1)
    # Freeze the log (no further cleaning) so the offsets read stay true while Spark reads.
    set_configs(cleanup_policy="delete", retention_ms="-1")
    time.sleep(1)  # a cleaning pass already running finishes
    offsets = surviving_offsets(kafka_bootstrap, tp)
    end = log_end(kafka_bootstrap, tp).stable
    assert end == 180 and len(offsets) < 120, offsets
    # A hole between two records left: [hole, after) holds none; the splits meet inside it.
    hole, after = next((o + 1, n) for o, n in itertools.pairwise(offsets) if n > o + 2)
    mid = hole + 1
    splits = [split_of(tp, 0, mid), split_of(tp, mid, end)]
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    first, rest = built(builder.build_batch(splits, make_spec(tmp_path / "a")))
    [empty] = built(builder.build_batch([split_of(tp, hole, after)], make_spec(tmp_path / "b")))
    assert [r["_offset"] for r in read(first.files, ["_offset"])] == [o for o in offsets if o < mid]
    assert [r["_offset"] for r in read(rest.files, ["_offset"])] == [o for o in offsets if o >= mid]
    assert (first.records, rest.records) == (
        len([o for o in offsets if o < mid]),
        len([o for o in offsets if o >= mid]),
    )
    assert (empty.records, empty.files, empty.holes) == (0, (), after - hole)
    assert (first.holes, rest.holes) == (mid - first.records, end - mid - rest.records)
    assert first.holes + rest.holes == end - len(offsets) > 0


# --------------------------------------------------------------------------- retention


def test_offsets_gone_from_the_log_fail_the_build_and_never_give_a_short_segment(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """``delete_records`` moved partition 0's log start past where its split begins: the split
    fails (Spark's ``failOnDataLoss``), as one starting a single offset below the new start does;
    no split ever becomes a segment holding fewer records than its range."""
    topic = make_topic(partitions=2)
    gone, whole = produce_blocks(
        kafka_bootstrap,
        topic,
        [(0, values([value(i) for i in range(100)])), (1, values([value(i) for i in range(40)]))],
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, 30)]).values():
        future.result(timeout=30)
    assert log_end(kafka_bootstrap, gone.tp).earliest == 30
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    spec = make_spec(tmp_path)
    lost, other = builder.build_batch([split_of(gone.tp, 10, 60), split_over(whole)], spec)
    assert isinstance(lost, BuildError), lost
    # The batch is one job: the other partition's split fails with it or is whole.
    assert isinstance(other, BuildError) or (isinstance(other, BuiltSegment) and other.records == 40), other
    [edge] = builder.build_batch([split_of(gone.tp, 29, 31)], spec)
    assert isinstance(edge, BuildError), edge
    [kept] = built(builder.build_batch([split_of(gone.tp, 30, 100)], spec))
    assert kept.records == 70
    assert sorted(str(p) for p in (tmp_path / "store").rglob("*.parquet")) == sorted(
        f.removeprefix("file://") for f in (*kept.files, *(other.files if isinstance(other, BuiltSegment) else ()))
    )


# --------------------------------------------------------------------------- consumer pool


def test_readers_of_one_group_with_other_client_properties_share_one_spark(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Spark pools its executors' Kafka consumers by group id and partition for the JVM's life
    and fails a task whose client properties differ from those the pool first saw for its key:
    two workers of one source with a ``client.id`` each (or one restarted with new properties)
    reading a partition through one long-lived Spark must both read it."""
    [offsets] = produce_blocks(kafka_bootstrap, make_topic(partitions=1), [(0, values([value(i) for i in range(10)]))])
    spec = make_spec(tmp_path)
    for client_id in ("worker-1", "worker-2"):
        reader = KafkaReader.of(kafka_bootstrap, "src-spark", {"client.id": client_id})
        [result] = SparkSegmentBuilder(spark, RecordingRegistrar(), reader).build_batch([split_over(offsets)], spec)
        assert isinstance(result, BuiltSegment) and result.row_count == 10, (client_id, result)


def test_a_jobs_read_of_a_few_records_does_not_wait_out_a_fetch(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """Every task of a job held one fetch at the broker for its consumer's whole
    ``fetch.max.wait.ms`` (Kafka's default, 500 ms), whatever its range: every build job's read
    took over half a second, a batch with rejects (two jobs) over a second."""
    [offsets] = produce_blocks(kafka_bootstrap, make_topic(partitions=1), [(0, values([value(i) for i in range(5)]))])
    kafka = reader(kafka_bootstrap)
    assert kafka.frame(spark, [split_over(offsets)]).count() == 5  # the first read: the JVM's first use of it
    took = []
    for _ in range(3):
        started = time.monotonic()
        assert kafka.frame(spark, [split_over(offsets)]).count() == 5
        took.append(time.monotonic() - started)
    print(f"reads took {', '.join(f'{t:.3f}' for t in took)} s")
    assert min(took) < 0.5, took  # below Kafka's default fetch wait, which each of them waited out


# --------------------------------------------------------------------------- kill switch

KILL_RECORDS = 600_000


@pytest.fixture(scope="module")
def big_range(kafka_bootstrap: str, make_module_topic: MakeTopic) -> OffsetRange:
    topic = make_module_topic(partitions=1, prefix="big")
    [offsets] = produce_blocks(kafka_bootstrap, topic, [(0, values([value(i) for i in range(KILL_RECORDS)]))])
    return offsets


def trip_once_reading(
    spark: Any, split: SealedSplit, tripped_at: list[tuple[float, bool]], timeout_s: float = 60.0
) -> threading.Thread:
    """Trip the split's switch half a second after the build's Spark job began (its task reads
    Kafka by then), not after a fixed delay from the call: how long a build takes to plan
    depends on the machine. Records when, and whether the job was still running."""

    def watch() -> None:
        tracker = spark.sparkContext.statusTracker()
        with contextlib.suppress(TimeoutError):  # then the trip comes before the job: still killed
            wait_until(tracker.getActiveJobsIds, timeout_s, "the build's Spark job", interval=0.005)
        time.sleep(0.5)
        tripped_at.append((time.monotonic(), bool(tracker.getActiveJobsIds())))
        split.kill_switch.trip("revoke")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_kill_switch_interrupts_a_build_reading_kafka_within_two_seconds(
    spark: Any, big_range: OffsetRange, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """A split whose job reads Kafka for several seconds more when its switch trips (a revoke):
    the job is interrupted and the build returns SplitKilled within 2 s, leaving nothing."""
    builder = spark_builder(spark, kafka_bootstrap, RecordingRegistrar())
    split = split_over(big_range)
    tripped: list[tuple[float, bool]] = []
    watcher = trip_once_reading(spark, split, tripped)
    started = time.monotonic()
    [result] = builder.build_batch([split], make_spec(tmp_path))
    returned = time.monotonic()
    watcher.join(5)
    assert tripped, f"the switch was not tripped: {result}"
    [(tripped_at, job_running)] = tripped
    print(f"tripped {tripped_at - started:.2f} s into the build, which returned {returned - tripped_at:.2f} s later")
    assert job_running, "the job had ended before the trip"
    assert isinstance(result, SplitKilled), result
    assert returned - tripped_at < 2.0, f"returned {returned - tripped_at:.2f} s after the trip"
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
