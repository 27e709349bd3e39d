"""The gap ledger against a real PostgreSQL: a skip is fenced like a publish."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
import pytest
from yoyo import get_backend, read_migrations

from ingest.config import Settings
from ingest.ops.status import source_gaps, source_status
from ingest_common.model import (
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    StoredPosition,
    TopicPartition,
)
from ingest_dev.postgres import PostgresServer
from metastore import Metastore, PublishConflict, apply_migrations
from metastore.migrations import MIGRATIONS, yoyo_url
from tests.integration.test_metastore import register

T0 = TopicPartition("events", 0)


@pytest.fixture
def store(database_url: str) -> Metastore:
    s = Metastore(database_url)
    s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "events", [0, 1], "earliest")
    return s


@contextmanager
def migrations_backend(database_url: str) -> Iterator[tuple[Any, Any]]:
    """yoyo's backend on ``database_url`` and the migrations, to apply some of them only."""
    backend = get_backend(yoyo_url(database_url))
    try:
        with resources.as_file(MIGRATIONS) as directory:
            yield backend, read_migrations(str(directory))
    finally:
        backend.connection.close()


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


def test_a_gap_at_the_same_offset_in_a_later_epoch_is_a_row_of_its_own(store: Metastore) -> None:
    """The ledger is keyed by epoch: after a reset replays the partition, the same offsets lost
    again are a gap of the new epoch, stopped ("fail") or skipped ("earliest"), and the earlier
    epoch's row stays where it was."""
    first = store.claim_from("src", "w1", [T0], start=0)[T0]
    _publish(store, first.serial, 0, 50)
    store.skip_gap("src", "w1", T0, first.serial, 50, 100)
    _publish(store, first.serial, 100, 120)
    store.reset_offsets("src", {T0: 0}, actor="t", reason="replay", target="0", confirmed=True)
    again = store.claim_partitions("src", "w2", [T0])[T0]
    _publish(store, again.serial, 0, 50)

    store.record_gap("src", "w2", T0, 50, 110)  # on_offset_out_of_range = "fail": stopped in epoch 1
    store.record_gap("src", "w2", T0, 50, 115)  # seen again in epoch 1: its own row grows
    assert [(g["epoch"], g["from_offset"], g["to_offset"], g["skipped"]) for g in store.gaps("src")] == [
        (0, 50, 100, True),
        (1, 50, 115, False),
    ]
    store.skip_gap("src", "w2", T0, again.serial, 50, 120)  # the policy became "earliest"
    assert [(g["epoch"], g["from_offset"], g["to_offset"], g["skipped"], g["worker"]) for g in store.gaps("src")] == [
        (0, 50, 100, True, "w1"),
        (1, 50, 120, True, "w2"),
    ]
    store.record_truncation("src", "w2", T0, 50, 60)  # a later report of either epoch's range: none moves
    assert [(g["epoch"], g["to_offset"], g["reason"]) for g in store.gaps("src")] == [
        (0, 100, "retention"),
        (1, 120, "retention"),
    ]


def test_the_epoch_keyed_ledger_migration_keeps_the_rows_of_an_older_schema(pg_server: PostgresServer) -> None:
    """Migration 0022 applied to a metastore that holds gaps written under 0021's key (one
    moved to epoch 1 by a skip after a reset, as that key did): every row stays as it was, and
    the new key takes a gap at an offset another epoch already has."""
    name = "t_" + uuid.uuid4().hex
    url = pg_server.create_database(name)
    try:
        with migrations_backend(url) as (backend, migrations):
            backend.apply_migrations(backend.to_apply(migrations.filter(lambda m: m.id < "0022")))
        with Metastore(url) as store:
            store.apply_source("src", {"name": "src"}, "name = 'src'")
            store.register_partitions("src", "events", [0, 1], "earliest")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ingest_offset_gaps (source, topic, partition, from_offset, to_offset, worker, skipped,"
                " skipped_at, epoch, reason) VALUES"
                " ('src', 'events', 0, 0, 10, 'w1', true, now(), 1, 'retention'),"
                " ('src', 'events', 0, 10, 20, 'w1', false, NULL, 0, 'retention'),"
                " ('src', 'events', 1, 5, 8, 'w1', false, NULL, 0, 'log_truncated')"
            )
        # The ledger's columns of 0021 (store.gaps reads the current schema's).
        columns = "SELECT id, topic, partition, from_offset, to_offset, skipped, epoch, reason FROM ingest_offset_gaps"
        with psycopg.connect(url, autocommit=True) as conn:
            before = conn.execute(columns + " ORDER BY id").fetchall()
        with Metastore(url) as store:
            assert "0022_gap_ledger_keyed_by_epoch" in apply_migrations(url)
            with psycopg.connect(url, autocommit=True) as conn:
                assert conn.execute(columns + " ORDER BY id").fetchall() == before
            claim = store.claim_from("src", "w2", [T0], start=0)[T0]
            store.skip_gap("src", "w2", T0, claim.serial, 0, 12)  # epoch 0 at offset 0: a row of its own
            store.record_gap("src", "w2", T0, 10, 25)  # epoch 0's stop seen again: the same row grows
            assert [(g["epoch"], g["from_offset"], g["to_offset"], g["skipped"]) for g in store.gaps("src")] == [
                (1, 0, 10, True),
                (0, 10, 25, False),
                (0, 5, 8, False),
                (0, 0, 12, True),
            ]
    finally:
        pg_server.drop_database(name)


def test_status_reads_a_stop_of_the_partitions_current_epoch_only(store: Metastore) -> None:
    """A partition stopped at 50 in epoch 0, replayed by a reset and back at 50 in epoch 1, is
    not stopped until epoch 1 finds the gap; ``ingest gaps list`` says which epoch each row is in."""
    no_kafka = Settings(database_url=store.url, kafka_bootstrap="")

    def state() -> tuple[str, object]:
        p0 = next(p for p in source_status(store, no_kafka, "src")["partitions"] if p["partition"] == 0)
        return p0["state"], p0["lost_range"]

    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    _publish(store, claim.serial, 0, 50)
    store.record_gap("src", "w1", T0, 50, 100)
    assert state() == ("OFFSET_OUT_OF_RANGE", [50, 100])
    store.reset_offsets("src", {T0: 0}, actor="t", reason="replay", target="0", confirmed=True)
    again = store.claim_partitions("src", "w2", [T0])[T0]
    _publish(store, again.serial, 0, 50)
    assert state() == ("OK", None)
    store.record_gap("src", "w2", T0, 50, 120)
    assert state() == ("OFFSET_OUT_OF_RANGE", [50, 120])
    assert [(g["epoch"], g["from_offset"], g["to_offset"]) for g in source_gaps(store, "src")] == [
        (0, 50, 100),
        (1, 50, 120),
    ]
