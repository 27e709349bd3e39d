"""One contract for the metastore calls a worker makes, run against the in-memory fake
(tests.fake_metastore.MemoryMetastore, which the unit tests use) and the real PostgreSQL Metastore:
where they disagree, the unit tests would prove nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    DesiredState,
    OffsetRange,
    PartitionClaim,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_common.redact import redact
from metastore import Metastore, PublishConflict, SourceNotFound
from tests.fake_metastore import MemoryMetastore

P0 = TopicPartition("t", 0)
P1 = TopicPartition("t", 1)
NEW = TopicPartition("t", 9)


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        s: Any = MemoryMetastore("src")
    else:
        s = Metastore(request.getfixturevalue("database_url"))
        s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "t", [0, 1], "latest")
    yield s
    if isinstance(s, Metastore):
        s.close()


def publish(
    store: Any, *ranges: tuple[TopicPartition, int, int, int], registered: bool = True, files: bool = True
) -> int:
    """Register a build of one split (as the builder does first), then publish it."""
    split_id, build = uuid.uuid4(), uuid.uuid4()
    root = f"file:///st/src/{{}}/{build}"
    if registered:
        store.register_build(
            "w1",
            BuildRegistration(
                build, "src", root.format("_staging"), root.format("segments"), root.format("rejects"), (split_id,)
            ),
        )
    written = (root.format("segments") + "/f.parquet",) if files else ()
    seg = BuiltSegment(split_id, root.format("segments"), written, 1 if files else 0, 1 if files else 0)
    item = SegmentToPublish(
        "src", 1, "w1", seg, tuple(PublishRange(OffsetRange(tp, lo, hi), serial) for tp, serial, lo, hi in ranges)
    )
    return int(store.publish(item))


def claim(store: Any, worker: str, tps: list[TopicPartition], start: int = 0) -> dict[TopicPartition, PartitionClaim]:
    """Claim as the rebalance handler does: a claim that finds nothing stored pins ``start``."""
    claims = store.claim_partitions("src", worker, tps)
    pins = [(c, start) for c in claims.values() if c.next_offset is None]
    return {**claims, **store.pin_start_offsets("src", pins)}


def test_every_claim_bumps_the_serial_and_reads_the_stored_offset(store: Any) -> None:
    first = store.claim_partitions("src", "w1", [P1, P0])
    assert first == {P0: PartitionClaim(P0, 1, None, "latest"), P1: PartitionClaim(P1, 1, None, "latest")}
    store.pin_start_offsets("src", [(first[P0], 0)])
    publish(store, (P0, 1, 0, 10))
    assert store.claim_partitions("src", "w2", [P0]) == {P0: PartitionClaim(P0, 2, 10, "latest")}
    assert store.partition_state("src", P0) == (2, 10)


def test_a_partition_without_a_row_is_created_at_claim_starting_from_earliest(store: Any) -> None:
    assert store.partition_state("src", NEW) is None
    assert store.claim_partitions("src", "w1", [NEW]) == {NEW: PartitionClaim(NEW, 1, None, "earliest")}


def test_a_start_is_pinned_once_under_the_current_claim_and_never_replaced(store: Any) -> None:
    first = store.claim_partitions("src", "w1", [P0])[P0]
    assert store.pin_start_offsets("src", [(first, 5)]) == {P0: PartitionClaim(P0, 1, 5, "latest")}
    second = store.claim_partitions("src", "w2", [P0])[P0]
    assert second == PartitionClaim(P0, 2, 5, "latest")  # the next claim reads it: never resolved again
    assert store.pin_start_offsets("src", [(second, 9)]) == {P0: PartitionClaim(P0, 2, 5, "latest")}
    assert store.pin_start_offsets("src", [(first, 7)]) == {}  # a superseded claim pins nothing
    assert store.partition_state("src", P0) == (2, 5)


def test_a_publish_before_the_start_is_pinned_is_refused(store: Any) -> None:
    store.claim_partitions("src", "w1", [P0])
    with pytest.raises(PublishConflict) as refused:
        publish(store, (P0, 1, 3, 10))
    assert (refused.value.reason, refused.value.expected, refused.value.actual) == ("offset", 3, None)
    assert store.partition_state("src", P0) == (1, None)


def test_a_publish_advances_each_offset_to_the_split_end(store: Any) -> None:
    claim(store, "w1", [P0])
    claim(store, "w1", [P1], start=5)
    publish(store, (P0, 1, 0, 10), (P1, 1, 5, 6))
    publish(store, (P0, 1, 10, 25))
    assert (store.partition_state("src", P0), store.partition_state("src", P1)) == ((1, 25), (1, 6))
    assert store.segment_for_split(uuid.uuid4()) is None


@pytest.mark.parametrize(
    ("ranges", "reason", "expected", "actual"),
    [
        (((P0, 1, 10, 20),), "serial", 1, 2),  # a zombie: another worker claimed after it
        (((P0, 2, 15, 20),), "offset", 15, 10),  # a gap after the stored offset
        (((P0, 2, 10, 20), (NEW, 1, 0, 10)), "missing", 1, None),  # no row: nothing written for P0 either
    ],
)
def test_a_refused_publish_writes_nothing_and_names_the_reason(
    store: Any, ranges: tuple[tuple[TopicPartition, int, int, int], ...], reason: str, expected: int, actual: int | None
) -> None:
    claim(store, "w1", [P0])
    claim(store, "w2", [P0])
    publish(store, (P0, 2, 0, 10))
    with pytest.raises(PublishConflict) as refused:
        publish(store, *ranges)
    assert (refused.value.reason, refused.value.expected, refused.value.actual) == (reason, expected, actual)
    assert store.partition_state("src", P0) == (2, 10)


def test_a_split_with_files_that_no_build_registered_is_refused(store: Any) -> None:
    claim(store, "w1", [P0])
    with pytest.raises(PublishConflict) as refused:
        publish(store, (P0, 1, 0, 10), registered=False)
    assert (refused.value.reason, refused.value.tp, refused.value.expected, refused.value.actual) == (
        "unregistered",
        P0,
        None,
        None,
    )
    assert store.partition_state("src", P0) == (1, 0)


def test_a_split_without_files_needs_no_build(store: Any) -> None:
    """Offsets that hold no record (transaction markers) are published without a build."""
    claim(store, "w1", [P0])
    publish(store, (P0, 1, 0, 2), registered=False, files=False)
    assert store.partition_state("src", P0) == (1, 2)


def test_an_offset_conflict_is_named_before_a_missing_registration(store: Any) -> None:
    claim(store, "w1", [P0])
    with pytest.raises(PublishConflict) as refused:
        publish(store, (P0, 1, 5, 10), registered=False)
    assert (refused.value.reason, refused.value.expected, refused.value.actual) == ("offset", 5, 0)


def test_skipping_a_gap_is_guarded_like_a_publish(store: Any) -> None:
    claim(store, "w1", [P0])
    publish(store, (P0, 1, 0, 10))
    with pytest.raises(PublishConflict) as offset:
        store.skip_gap("src", "w1", P0, 1, 5, 50)
    with pytest.raises(PublishConflict) as serial:
        store.skip_gap("src", "w1", P0, 7, 10, 50)
    assert (offset.value.reason, serial.value.reason) == ("offset", "serial")
    assert isinstance(store.skip_gap("src", "w1", P0, 1, 10, 50), int)
    assert store.partition_state("src", P0) == (1, 50)
    store.record_gap("src", "w1", P0, 50, 60)  # recorded only: the offset stays
    assert store.partition_state("src", P0) == (1, 50)


A_ID, B_ID = "AAAAAAAAAAAAAAAAAAAAAQ", "BBBBBBBBBBBBBBBBBBBBBQ"


def test_a_claim_records_the_topic_id_where_none_is_and_returns_a_stored_one_unchanged(store: Any) -> None:
    """KIP-516 (migrations/0027): the id Kafka gave before the claim is recorded where the row
    has none, or nothing to read from yet; once an offset is stored with it, a claim keeps it
    and returns it, so the claimer sees a re-created topic (another id) for what it is."""
    first = store.claim_partitions("src", "w1", [P0, P1], {"t": A_ID})
    assert {c.topic_id for c in first.values()} == {A_ID}
    pinned = store.pin_start_offsets("src", [(first[P0], 5)])
    assert pinned[P0].topic_id == A_ID
    # P1 has nothing stored yet: its id follows Kafka's; P0's stays, whatever Kafka says now.
    again = store.claim_partitions("src", "w2", [P0, P1], {"t": B_ID})
    assert (again[P0].topic_id, again[P1].topic_id) == (A_ID, B_ID)
    assert store.claim_partitions("src", "w1", [P0])[P0].topic_id == A_ID  # Kafka not asked: kept
    assert store.stored_position("src", P0).topic_id == A_ID


def test_a_topic_id_is_recorded_under_the_current_claim_only_where_none_or_offset_0_is_stored(store: Any) -> None:
    c = claim(store, "w1", [P0, P1])
    assert store.stored_position("src", P0).topic_id is None
    assert store.record_topic_id("src", P0, c[P0].serial + 1, A_ID) is None  # a stale serial: fenced
    assert store.record_topic_id("src", P0, c[P0].serial, A_ID) == A_ID
    publish(store, (P0, c[P0].serial, 0, 10))
    assert store.record_topic_id("src", P0, c[P0].serial, B_ID) == A_ID  # another topic's: kept
    assert store.stored_position("src", P0).topic_id == A_ID
    assert store.record_topic_id("src", P1, c[P1].serial, A_ID) == A_ID
    assert store.record_topic_id("src", P1, c[P1].serial, B_ID) == B_ID  # at offset 0 nothing lies below
    store.record_topic_recreation("src", "w1", P0, 0, 10, A_ID, B_ID)  # recorded, the partition stays
    assert store.stored_position("src", P0).next_offset == 10


def test_release_clears_the_owner_only_for_the_current_claim(store: Any) -> None:
    old = store.claim_partitions("src", "w1", [P0])[P0]
    store.claim_partitions("src", "w2", [P0])
    store.release_partition("src", "w1", old)  # stale: must not clear w2
    held = store.reclaim_partitions("src", "w2", [(P0, 1)])  # w2 owns it: its serial moved since 1
    assert held == {P0: PartitionClaim(P0, 3, None, "latest")}
    assert store.reclaim_partitions("src", "w1", [(P0, 1)]) == {}  # not the owner: fenced, not reclaimed
    assert store.reclaim_partitions("src", "w2", [(P0, 3)]) == {}  # nothing moved


def workers(store: Any, source: str = "src") -> list[tuple[Any, ...]]:
    """What ``ingest status`` lists of the live workers: read through the status query."""
    return [
        (r["worker"], r["host"], r["pid"], r["version"], r["state"], list(r["partitions"]), r["spec_version"])
        for r in store.live_workers(source)
    ]


def test_a_heartbeat_writes_the_workers_row_and_the_next_beat_replaces_it(store: Any) -> None:
    store.heartbeat("src", "w1", "host-a", 11, "1.0", "starting", [], None)
    store.heartbeat("src", "w2", "host-b", 12, "1.0", "running", ["t[1]"], 1)
    assert workers(store) == [
        ("w1", "host-a", 11, "1.0", "starting", [], None),
        ("w2", "host-b", 12, "1.0", "running", ["t[1]"], 1),
    ]
    # The next beat of w1 (the same id reused by a new process: another host, pid, version).
    store.heartbeat("src", "w1", "host-c", 13, "1.1", "running", ["t[0]", "t[2]"], 2)
    assert workers(store) == [
        ("w1", "host-c", 13, "1.1", "running", ["t[0]", "t[2]"], 2),
        ("w2", "host-b", 12, "1.0", "running", ["t[1]"], 1),
    ]


def test_a_heartbeat_is_listed_under_the_source_it_names_and_only_while_the_worker_runs(store: Any) -> None:
    store.heartbeat("other", "w9", "host", 1, "1.0", "running", [], None)  # written, as the table has no check
    store.heartbeat("src", "w1", "host", 2, "1.0", "stopped", [], 1)
    store.heartbeat("src", "w2", "host", 3, "1.0", "failed", [], 1)
    store.heartbeat("src", "w3", "host", 4, "1.0", "draining", ["t[0]"], 1)
    assert workers(store) == [("w3", "host", 4, "1.0", "draining", ["t[0]"], 1)]
    assert workers(store, "other") == [("w9", "host", 1, "1.0", "running", [], None)]


def test_a_workers_start_is_its_first_beat_unless_the_process_reports_its_own(store: Any) -> None:
    first = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    store.heartbeat("src", "w1", "host", 1, "1.0", "running", [], 1, started_at=first)
    store.heartbeat("src", "w1", "host", 1, "1.0", "running", [], 1)  # no start given: kept
    assert [r["started_at"] for r in store.live_workers("src")] == [first]
    restarted = first + timedelta(hours=1)
    store.heartbeat("src", "w1", "host", 2, "1.0", "running", [], 1, started_at=restarted)
    assert [r["started_at"] for r in store.live_workers("src")] == [restarted]


def test_a_recorded_error_is_kept_redacted_and_cut_to_2000_characters_newest_first(store: Any) -> None:
    store.record_error("src", "w1", "BUILD_FAILED", "t[0]: boom")
    long = "connecting to postgresql://ingest:hunter22@db/ingest failed: " + "x" * 3000
    store.record_error("src", "w2", "METASTORE_UNAVAILABLE", long)
    store.record_error("other", "w3", "BUILD_FAILED", "not this source's")
    errors = [(r["worker"], r["kind"], r["message"]) for r in store.recent_errors("src")]
    assert errors == [
        ("w2", "METASTORE_UNAVAILABLE", redact(long)[:2000]),
        ("w1", "BUILD_FAILED", "t[0]: boom"),
    ]
    assert "hunter22" not in errors[0][2] and len(errors[0][2]) == 2000
    assert [r["kind"] for r in store.recent_errors("src", limit=1)] == ["METASTORE_UNAVAILABLE"]


def test_controls_are_read_and_set(store: Any) -> None:
    control = store.control("src")
    assert (control.desired_state, control.drain_stay) == (DesiredState.RUNNING, False)
    store.set_control("src", DesiredState.SUSPENDED)
    assert store.control("src").desired_state is DesiredState.SUSPENDED
    store.set_control("src", DesiredState.DRAINING, stay=True)
    control = store.control("src")
    assert (control.desired_state, control.drain_stay) == (DesiredState.DRAINING, True)


def test_the_latest_spec_is_read_with_its_version(store: Any) -> None:
    assert store.latest_spec("src") == (1, {"name": "src"})


def test_an_unknown_source_has_no_controls_and_no_spec(store: Any) -> None:
    with pytest.raises(SourceNotFound):
        store.control("nope")
    with pytest.raises(SourceNotFound):
        store.latest_spec("nope")


def test_a_split_published_again_answers_with_its_segment_and_writes_nothing(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry after a lost reply, whose orphaned session committed meanwhile: idempotent by
    split id, whatever the checks say now (the offset moved past it, another worker claimed)."""
    sent: list[SegmentToPublish] = []
    publish_once = store.publish
    monkeypatch.setattr(store, "publish", lambda item: sent.append(item) or publish_once(item))
    claim(store, "w1", [P0])
    earlier = publish(store, (P0, 1, 0, 5))
    segment_id = publish(store, (P0, 1, 5, 10))
    assert segment_id != earlier
    assert store.publish(sent[1]) == segment_id
    store.claim_partitions("src", "w2", [P0])
    assert store.publish(sent[1]) == segment_id
    assert store.segment_for_split(sent[1].segment.split_id) == segment_id
    assert store.segment_for_split(sent[0].segment.split_id) == earlier
    assert store.partition_state("src", P0) == (2, 10)
