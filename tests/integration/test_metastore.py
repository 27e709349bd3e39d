"""The metastore against a real PostgreSQL."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from ingest.model import BuiltSegment, OffsetRange, PublishRange, SegmentToPublish, TopicPartition
from metastore import Metastore, PublishConflict, SourceNotFound, apply_migrations
from metastore.errors import MetastoreUnavailable, SchemaMissing

T0 = TopicPartition("events", 0)
T1 = TopicPartition("events", 1)


@pytest.fixture
def store(database_url: str) -> Metastore:
    s = Metastore(database_url)
    s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "events", [0, 1], "earliest")
    return s


def item(tp: TopicPartition, serial: int, start: int, end: int) -> SegmentToPublish:
    split_id = uuid.uuid4()
    seg = BuiltSegment(split_id=split_id, location=f"file:///seg/{split_id}", files=(f"file:///seg/{split_id}/a",),
                       row_count=end - start, size_bytes=100)
    return SegmentToPublish(source="src", spec_version=1, worker_id="w", segment=seg,
                            ranges=(PublishRange(OffsetRange(tp, start, end), serial),))


def test_migrations_apply_once_then_are_a_no_op(pg_server: object, database_url: str) -> None:
    # database_url comes from the migrated template: everything is applied already.
    assert apply_migrations(database_url) == []


def test_an_empty_database_gets_the_whole_schema(pg_server: object, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE empty_for_migrations")
    url = database_url.rsplit("/", 1)[0] + "/empty_for_migrations"
    with pytest.raises(SchemaMissing, match="ingest migrate"):
        Metastore(url).list_sources()
    assert len(apply_migrations(url)) >= 1
    assert Metastore(url).list_sources() == []


def test_claim_bumps_serial_and_returns_the_stored_offset(store: Metastore) -> None:
    first = store.claim_partitions("src", "w1", [T0, T1])
    assert first[T0].serial == 1 and first[T0].next_offset is None and first[T0].initial_position == "earliest"
    store.publish(item(T0, 1, 0, 10))
    second = store.claim_partitions("src", "w2", [T0])
    assert second[T0].serial == 2 and second[T0].next_offset == 10
    owners = {(r["topic"], r["partition"]): r["owner"] for r in store.partitions("src")}
    assert owners[("events", 0)] == "w2"


def test_a_partition_that_appears_later_starts_from_earliest(store: Metastore) -> None:
    store.register_partitions("src", "events", [0, 1], "latest")  # existing rows are left alone
    new = TopicPartition("events", 7)
    claims = store.claim_partitions("src", "w1", [new, T0])
    assert claims[new].initial_position == "earliest" and claims[new].serial == 1
    assert claims[T0].initial_position == "earliest"


def test_publish_advances_offsets_and_records_the_segment(store: Metastore) -> None:
    claim = store.claim_partitions("src", "w1", [T0])[T0]
    seg_id = store.publish(item(T0, claim.serial, 0, 10))
    store.publish(item(T0, claim.serial, 10, 25))
    segments = store.segments("src")
    assert next(s["id"] for s in segments) == seg_id
    assert [s["ranges"] for s in segments] == [
        [{"topic": "events", "partition": 0, "start": 0, "end": 10}],
        [{"topic": "events", "partition": 0, "start": 10, "end": 25}],
    ]
    assert store.partition_state("src", T0) == (claim.serial, 25)


def test_the_partition_status_view(store: Metastore, database_url: str) -> None:
    claim = store.claim_partitions("src", "w1", [T0])[T0]
    store.publish(item(T0, claim.serial, 0, 10))
    with pytest.raises(PublishConflict):
        store.publish(item(T0, claim.serial - 1, 10, 20))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT topic, partition, next_offset, serial, owner, segments, publish_conflicts "
                            "FROM ingest_partition_status WHERE source = 'src' ORDER BY partition").fetchall()
    assert rows == [("events", 0, 10, claim.serial, "w1", 1, 1), ("events", 1, None, 0, None, 0, 0)]


def test_a_zombie_cannot_publish_after_another_worker_claimed(store: Metastore) -> None:
    zombie = store.claim_partitions("src", "zombie", [T0])[T0]
    store.claim_partitions("src", "new-owner", [T0])
    with pytest.raises(PublishConflict) as info:
        store.publish(item(T0, zombie.serial, 0, 10))
    assert info.value.reason == "serial"
    assert store.segments("src") == []
    assert store.partition_state("src", T0) == (zombie.serial + 1, None)
    assert store.conflict_counts("src") == {"serial": 1}


def test_a_gap_or_an_overlap_is_refused(store: Metastore) -> None:
    claim = store.claim_partitions("src", "w1", [T0])[T0]
    store.publish(item(T0, claim.serial, 0, 10))
    for start, end in ((11, 20), (5, 20), (0, 10)):
        with pytest.raises(PublishConflict) as info:
            store.publish(item(T0, claim.serial, start, end))
        assert info.value.reason == "offset" and info.value.actual == 10
    assert len(store.segments("src")) == 1


def test_a_multi_partition_publish_is_all_or_nothing(store: Metastore) -> None:
    claims = store.claim_partitions("src", "w1", [T0, T1])
    store.claim_partitions("src", "other", [T1])
    seg = item(T0, claims[T0].serial, 0, 10)
    both = SegmentToPublish(
        source="src", spec_version=1, worker_id="w", segment=seg.segment,
        ranges=(PublishRange(OffsetRange(T0, 0, 10), claims[T0].serial),
                PublishRange(OffsetRange(T1, 0, 10), claims[T1].serial)),
    )
    with pytest.raises(PublishConflict):
        store.publish(both)
    assert store.partition_state("src", T0) == (claims[T0].serial, None)
    assert store.segments("src") == []


def test_sources_are_versioned_and_unchanged_specs_are_not(store: Metastore) -> None:
    assert store.apply_source("src", {"name": "src"}, "same") == (1, False)
    assert store.apply_source("src", {"name": "src", "x": 1}, "changed") == (2, True)
    assert store.latest_spec("src") == (2, {"name": "src", "x": 1})
    with pytest.raises(SourceNotFound, match="ingest source apply"):
        store.latest_spec("nope")


def test_unreachable_postgres_is_one_clear_error() -> None:
    with pytest.raises(MetastoreUnavailable, match=r"PostgreSQL unavailable at postgresql://u:\*\*\*@127.0.0.1:1/db"):
        Metastore("postgresql://u:secret@127.0.0.1:1/db").ping()
