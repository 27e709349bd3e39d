"""The gap ledger against a real PostgreSQL: a skip is fenced like a publish."""

from __future__ import annotations

import uuid

import pytest

from ingest_common.model import (
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    StoredPosition,
    TopicPartition,
)
from metastore import Metastore, PublishConflict
from tests.integration.test_metastore import register

T0 = TopicPartition("events", 0)


@pytest.fixture
def store(database_url: str) -> Metastore:
    s = Metastore(database_url)
    s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "events", [0, 1], "earliest")
    return s


def _publish(store: Metastore, serial: int, start: int, end: int, leader_epoch: int | None = None) -> None:
    split_id = uuid.uuid4()
    build = register(store, split_id)
    seg = BuiltSegment(
        split_id=split_id,
        location=f"file:///st/src/segments/{build}",
        files=(f"file:///st/src/segments/{build}/part-{split_id}.parquet",),
        row_count=end - start,
        size_bytes=100,
    )
    store.publish(
        SegmentToPublish(
            source="src",
            spec_version=1,
            worker_id="w",
            segment=seg,
            ranges=(PublishRange(OffsetRange(T0, start, end), serial, leader_epoch),),
        )
    )


def test_the_leader_epoch_is_stored_with_next_offset_and_cleared_by_skips_and_resets(store: Metastore) -> None:
    """Migration 0020: a publish stores its last record's leader epoch with the new next_offset,
    a claim and a rewind read it; any other move of next_offset leaves no epoch known."""
    first = store.claim_from("src", "w1", [T0], start=0)[T0]
    assert first.leader_epoch is None  # pinned: nothing published, no epoch
    _publish(store, first.serial, 0, 50, leader_epoch=7)
    again = store.claim_partitions("src", "w2", [T0])[T0]
    assert (again.next_offset, again.leader_epoch) == (50, 7)
    assert store.stored_position("src", T0) == StoredPosition(again.serial, 50, 7)
    _publish(store, again.serial, 50, 60)  # its last offset held no record: no epoch known
    assert store.stored_position("src", T0) == StoredPosition(again.serial, 60, None)
    _publish(store, again.serial, 60, 70, leader_epoch=8)
    store.skip_gap("src", "w2", T0, again.serial, 70, 100)
    assert store.stored_position("src", T0) == StoredPosition(again.serial, 100, None)
    _publish(store, again.serial, 100, 110, leader_epoch=8)
    store.reset_offsets("src", {T0: 5}, actor="t", reason="r", target="5", confirmed=True)
    position = store.stored_position("src", T0)
    assert position is not None and (position.next_offset, position.leader_epoch) == (5, None)


def test_a_truncation_is_recorded_as_a_gap_with_its_reason_and_never_skipped(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    _publish(store, claim.serial, 0, 50, leader_epoch=0)
    store.record_truncation("src", "w1", T0, 12, 50)
    store.record_truncation("src", "w2", T0, 12, 50)  # seen again (a restart): the same row
    [gap] = store.gaps("src")
    assert (gap["from_offset"], gap["to_offset"], gap["skipped"], gap["reason"], gap["worker"]) == (
        12,
        50,
        False,
        "log_truncated",
        "w2",
    )
    assert store.partition_state("src", T0) == (claim.serial, 50)


def test_a_skip_by_a_fenced_worker_or_from_a_moved_offset_changes_nothing(store: Metastore) -> None:
    old = store.claim_from("src", "w1", [T0], start=0)[T0]
    _publish(store, old.serial, 0, 50)
    new = store.claim_from("src", "w2", [T0], start=0)[T0]  # w1 is a zombie now

    with pytest.raises(PublishConflict) as stale:
        store.skip_gap("src", "w1", T0, old.serial, 50, 3000)
    assert stale.value.reason == "serial"
    with pytest.raises(PublishConflict) as moved:
        store.skip_gap("src", "w2", T0, new.serial, 40, 3000)
    assert moved.value.reason == "offset"
    # Both rolled back: no ledger row, the offset did not move.
    assert store.gaps("src") == [] and store.partition_state("src", T0) == (new.serial, 50)

    gap_id = store.skip_gap("src", "w2", T0, new.serial, 50, 3000)
    assert store.partition_state("src", T0) == (new.serial, 3000)
    [gap] = store.gaps("src")
    assert (gap["id"], gap["from_offset"], gap["to_offset"], gap["skipped"], gap["worker"]) == (
        gap_id,
        50,
        3000,
        True,
        "w2",
    )
    assert gap["skipped_at"] is not None and gap["acknowledged_at"] is None


def test_a_stopped_gap_grows_with_retention_and_a_skipped_one_is_never_reopened(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    _publish(store, claim.serial, 0, 50)
    store.record_gap("src", "w1", T0, 50, 1000)
    store.record_gap("src", "w2", T0, 50, 4000)  # seen again later (a restart): retention moved on
    [gap] = store.gaps("src")
    assert (gap["from_offset"], gap["to_offset"], gap["skipped"], gap["worker"]) == (50, 4000, False, "w2")
    assert store.partition_state("src", T0) == (claim.serial, 50)  # "fail" never moves the offset

    store.skip_gap("src", "w1", T0, claim.serial, 50, 4200)  # the policy became "earliest"
    store.record_gap("src", "w3", T0, 50, 9000)  # a late report of the old stop
    [gap] = store.gaps("src")
    assert (gap["to_offset"], gap["skipped"], gap["worker"]) == (4200, True, "w1")


def test_acknowledging_gaps(store: Metastore) -> None:
    store.record_gap("src", "w1", T0, 0, 10)
    store.record_gap("src", "w1", TopicPartition("events", 1), 5, 20)
    first, second = (int(g["id"]) for g in store.gaps("src"))
    assert store.acknowledge_gaps("src", "alice", [first]) == [first]
    assert store.acknowledge_gaps("src", "bob") == [second]
    assert store.acknowledge_gaps("src", "bob") == []
    assert [g["acknowledged_by"] for g in store.gaps("src")] == ["alice", "bob"]
