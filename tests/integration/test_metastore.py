"""The metastore against a real PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.testkit import wait_until
from metastore import Metastore, PublishConflict, SourceNotFound, apply_migrations
from metastore.errors import CommitOutcomeUnknown, MetastoreUnavailable, SchemaMissing

T0 = TopicPartition("events", 0)
T1 = TopicPartition("events", 1)


@pytest.fixture
def store(database_url: str) -> Metastore:
    s = Metastore(database_url)
    s.apply_source("src", {"name": "src"}, "name = 'src'")
    s.register_partitions("src", "events", [0, 1], "earliest")
    return s


def register(store: Metastore, *split_ids: uuid.UUID, source: str = "src") -> uuid.UUID:
    """Register a build of these splits, as a worker's builder does before writing."""
    build = uuid.uuid4()
    store.register_build(
        "w",
        BuildRegistration(
            build,
            source,
            f"file:///st/{source}/_staging/{build}",
            f"file:///st/{source}/segments/{build}",
            f"file:///st/{source}/rejects/{build}",
            split_ids,
        ),
    )
    return build


def item(store: Metastore, tp: TopicPartition, serial: int, start: int, end: int) -> SegmentToPublish:
    split_id = uuid.uuid4()
    build = register(store, split_id)
    seg = BuiltSegment(
        split_id=split_id,
        location=f"file:///st/src/segments/{build}",
        files=(f"file:///st/src/segments/{build}/part-{split_id}.parquet",),
        row_count=end - start,
        size_bytes=100,
    )
    return SegmentToPublish(
        source="src",
        spec_version=1,
        worker_id="w",
        segment=seg,
        ranges=(PublishRange(OffsetRange(tp, start, end), serial),),
    )


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
    store.pin_start_offsets("src", [(first[T0], 0)])
    store.publish(item(store, T0, 1, 0, 10))
    second = store.claim_from("src", "w2", [T0], start=0)
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
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    seg_id = store.publish(item(store, T0, claim.serial, 0, 10))
    store.publish(item(store, T0, claim.serial, 10, 25))
    segments = store.segments("src")
    assert next(s["id"] for s in segments) == seg_id
    assert [s["ranges"] for s in segments] == [
        [{"topic": "events", "partition": 0, "start": 0, "end": 10, "epoch": 0}],
        [{"topic": "events", "partition": 0, "start": 10, "end": 25, "epoch": 0}],
    ]
    assert store.partition_state("src", T0) == (claim.serial, 25)


def test_segments_since_and_limit_keep_the_newest_oldest_first(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    ids = [store.publish(item(store, T0, claim.serial, start, start + 10)) for start in (0, 10, 20, 30)]
    assert [s["id"] for s in store.segments("src", limit=2)] == ids[2:]
    published = {s["id"]: s["published_at"] for s in store.segments("src")}
    assert [s["id"] for s in store.segments("src", since=published[ids[1]])] == ids[1:]
    assert [s["id"] for s in store.segments("src", since=published[ids[1]], limit=1)] == ids[3:]
    assert store.segments("src", since=datetime.now(UTC) + timedelta(hours=1)) == []


def test_the_partition_status_view(store: Metastore, database_url: str) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    store.publish(item(store, T0, claim.serial, 0, 10))
    with pytest.raises(PublishConflict):
        store.publish(item(store, T0, claim.serial - 1, 10, 20))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT topic, partition, next_offset, serial, owner, segments, publish_conflicts "
            "FROM ingest_partition_status WHERE source = 'src' ORDER BY partition"
        ).fetchall()
    assert rows == [("events", 0, 10, claim.serial, "w1", 1, 1), ("events", 1, None, 0, None, 0, 0)]


def test_a_zombie_cannot_publish_after_another_worker_claimed(store: Metastore) -> None:
    zombie = store.claim_from("src", "zombie", [T0], start=0)[T0]
    store.claim_from("src", "new-owner", [T0], start=0)
    with pytest.raises(PublishConflict) as info:
        store.publish(item(store, T0, zombie.serial, 0, 10))
    assert info.value.reason == "serial"
    assert store.segments("src") == []
    assert store.partition_state("src", T0) == (zombie.serial + 1, 0)  # still the pinned start
    assert store.conflict_counts("src") == {"serial": 1}


def test_a_gap_or_an_overlap_is_refused(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    store.publish(item(store, T0, claim.serial, 0, 10))
    for start, end in ((11, 20), (5, 20), (0, 10)):
        with pytest.raises(PublishConflict) as info:
            store.publish(item(store, T0, claim.serial, start, end))
        assert info.value.reason == "offset" and info.value.actual == 10
    assert len(store.segments("src")) == 1


def test_a_multi_partition_publish_is_all_or_nothing(store: Metastore) -> None:
    claims = store.claim_from("src", "w1", [T0, T1], start=0)
    store.claim_from("src", "other", [T1], start=0)
    seg = item(store, T0, claims[T0].serial, 0, 10)
    both = SegmentToPublish(
        source="src",
        spec_version=1,
        worker_id="w",
        segment=seg.segment,
        ranges=(
            PublishRange(OffsetRange(T0, 0, 10), claims[T0].serial),
            PublishRange(OffsetRange(T1, 0, 10), claims[T1].serial),
        ),
    )
    with pytest.raises(PublishConflict):
        store.publish(both)
    assert store.partition_state("src", T0) == (claims[T0].serial, 0)  # still the pinned start
    assert store.segments("src") == []


def test_a_publish_is_one_statement_and_one_round_trip(store: Metastore, tmp_path: Path) -> None:
    """The whole transaction (lock, checks, inserts, offsets) is one call: the publishing
    thread waits for one reply, not one per step (each reply makes the publishing thread win the
    GIL back from the consumer thread: docs/benchmarks.md, "Earlier runs and analysis")."""
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    trace = tmp_path / "libpq.trace"
    conn = store._connection()
    registered = item(store, T0, claim.serial, 0, 10)  # registering is the build's round trip
    with trace.open("w") as f:
        conn.pgconn.trace(f.fileno())
        try:
            store.publish(registered)
        finally:
            conn.pgconn.untrace()
    # Trace lines: timestamp, direction (F: frontend, B: backend), length, message type, fields.
    fields = [line.split("\t") for line in trace.read_text().splitlines()]
    sent = [f[3] for f in fields if len(f) > 3 and f[1] == "F"]
    assert sent.count("Sync") == 1 and "Query" not in sent, sent
    assert store.partition_state("src", T0) == (claim.serial, 10)


def test_a_partition_without_a_row_is_refused_and_recorded(store: Metastore) -> None:
    unknown = TopicPartition("events", 7)
    with pytest.raises(PublishConflict) as info:
        store.publish(item(store, unknown, 1, 0, 10))
    assert (info.value.reason, info.value.tp, info.value.expected, info.value.actual) == ("missing", unknown, 1, None)
    assert store.segments("src") == [] and store.conflict_counts("src") == {"missing": 1}


@contextmanager
def row_locked(database_url: str, tp: TopicPartition) -> Iterator[None]:
    """Another session holds the partition's row lock for the duration."""
    with psycopg.connect(database_url) as other:
        other.execute(
            "SELECT 1 FROM ingest_partitions WHERE source = 'src' AND topic = %s AND partition = %s FOR UPDATE",
            (tp.topic, tp.partition),
        )
        yield


def test_a_publish_the_server_refused_is_known_not_to_have_committed(store: Metastore, database_url: str) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    store._connection().execute("SET lock_timeout = 200")
    publish = item(store, T0, claim.serial, 0, 10)
    with row_locked(database_url, T0), pytest.raises(MetastoreUnavailable) as info:
        store.publish(publish)
    assert not isinstance(info.value, CommitOutcomeUnknown)
    assert store.segment_for_split(publish.segment.split_id) is None
    assert store.publish(publish) > 0


def test_a_publish_whose_connection_dies_has_an_unknown_outcome(store: Metastore, database_url: str) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)[T0]
    pid = store._connection().info.backend_pid
    publish = item(store, T0, claim.serial, 0, 10)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            store.publish(publish)
        except BaseException as exc:
            outcome.append(exc)

    with row_locked(database_url, T0), psycopg.connect(database_url, autocommit=True) as admin:
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(
            lambda: admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
            ).fetchone(),
            10,
            "the publish to wait for the row lock",
            interval=0.02,
        )
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], CommitOutcomeUnknown)
    assert store.segment_for_split(publish.segment.split_id) is None
    assert store.publish(publish) > 0 and store.partition_state("src", T0) == (claim.serial, 10)


def test_sources_are_versioned_and_unchanged_specs_are_not(store: Metastore) -> None:
    assert store.apply_source("src", {"name": "src"}, "same") == (1, False)
    assert store.apply_source("src", {"name": "src", "x": 1}, "changed") == (2, True)
    assert store.latest_spec("src") == (2, {"name": "src", "x": 1})
    with pytest.raises(SourceNotFound, match="ingest source apply"):
        store.latest_spec("nope")


def test_an_apply_check_sees_the_version_it_follows_and_a_refusal_stores_nothing(
    store: Metastore, database_url: str
) -> None:
    def refuse(version: int, spec: dict[str, object]) -> None:
        raise ValueError(f"refused after {version}")

    with pytest.raises(ValueError, match="refused after 1"):
        store.apply_source("src", {"name": "src", "x": 1}, "", follows=refuse)
    assert store.latest_spec("src") == (1, {"name": "src"})

    # A second apply racing the first checks against the version the first stored, never
    # against the one both read before: its check runs under the same locks.
    inside, seen = threading.Event(), []

    def slow(version: int, spec: dict[str, object]) -> None:
        inside.set()
        other = threading.Thread(
            target=lambda: seen.append(
                Metastore(database_url).apply_source(
                    "src", {"name": "src", "x": 3}, "", follows=lambda v, doc: seen.append((v, doc))
                )
            ),
            daemon=True,
        )
        other.start()
        other.join(1.0)  # it waits for this transaction's locks
        assert other.is_alive() and seen == []
        threads.append(other)

    threads: list[threading.Thread] = []
    assert store.apply_source("src", {"name": "src", "x": 2}, "", follows=slow) == (2, True)
    threads[0].join(10)
    assert inside.is_set() and seen == [(2, {"name": "src", "x": 2}), (3, True)]


def test_unreachable_postgres_is_one_clear_error() -> None:
    with pytest.raises(MetastoreUnavailable, match=r"PostgreSQL unavailable at postgresql://u:\*\*\*@127.0.0.1:1/db"):
        Metastore("postgresql://u:secret@127.0.0.1:1/db").ping()


# -- resets, terminate, spec versions, NOTIFY ---------------------------------------------


def test_a_reset_fences_a_publish_with_the_pre_reset_serial_and_is_audited(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0, T1], start=0)
    first = store.publish(item(store, T0, claim[T0].serial, 0, 10))
    store.publish(item(store, T0, claim[T0].serial, 10, 20))
    before = store.control("src").reset_generation
    # Replays [5, 20): refused without confirmation, and nothing is written.
    plan = store.reset_offsets(
        "src", {T0: 5}, actor="op@host", reason="bad parse", target="events:0=5", confirmed=False
    )
    assert plan.reset_id is None and plan.changes_data and plan.partitions[0].replayed == (5, 20)
    assert store.partition_state("src", T0) == (claim[T0].serial, 20)
    done = store.reset_offsets("src", {T0: 5}, actor="op@host", reason="bad parse", target="events:0=5", confirmed=True)
    assert done.reset_id is not None and store.control("src").reset_generation == before + 1
    assert store.partition_state("src", T0) == (claim[T0].serial + 1, 5)
    # The split that was in flight when the reset committed presents the old serial: refused.
    with pytest.raises(PublishConflict) as refused:
        store.publish(item(store, T0, claim[T0].serial, 20, 30))
    assert refused.value.reason == "serial"
    assert store.conflict_counts("src") == {"serial": 1}
    # The owner re-claims (serial bumped again) and re-reads the offset the reset stored; T1 was not reset.
    reclaimed = store.reclaim_partitions("src", "w1", [(T0, claim[T0].serial), (T1, claim[T1].serial)])
    assert set(reclaimed) == {T0} and reclaimed[T0].serial == claim[T0].serial + 2 and reclaimed[T0].next_offset == 5
    assert store.reclaim_partitions("src", "w2", [(T0, claim[T0].serial)]) == {}  # only the recorded owner
    # The replay publishes offsets (and range starts) of the old epoch again.
    store.publish(item(store, T0, reclaimed[T0].serial, 5, 10))
    store.publish(item(store, T0, reclaimed[T0].serial, 10, 12))
    [audit] = store.recent_resets("src")
    assert audit["actor"] == "op@host" and audit["reason"] == "bad parse" and audit["target"] == "events:0=5"
    [p] = audit["partitions"]
    assert (p["old_offset"], p["new_offset"], p["replayed_start"], p["replayed_end"], p["skipped_start"]) == (
        20,
        5,
        5,
        20,
        None,
    )
    assert p["last_segment_id"] == first + 1  # segments after it belong to the new epoch


def test_a_reset_that_skips_is_planned_from_the_stored_offsets(store: Metastore) -> None:
    claim = store.claim_from("src", "w1", [T0], start=0)
    store.publish(item(store, T0, claim[T0].serial, 0, 10))
    plan = store.reset_offsets(
        "src", {T0: 40, T1: 7}, actor="a", reason="", target="latest", confirmed=False, earliest={T1: 3}
    )
    assert [(p.tp, p.old_offset, p.skipped, p.replayed) for p in plan.partitions] == [
        (T0, 10, (10, 40), None),
        (T1, None, (3, 7), None),
    ]
    # Setting an offset to what is stored changes nothing and needs no confirmation.
    assert store.reset_offsets("src", {T0: 10}, actor="a", reason="", target="x", confirmed=False).partitions == ()
    from metastore.errors import InvalidReset

    with pytest.raises(InvalidReset, match="no partition"):
        store.reset_offsets("src", {TopicPartition("events", 9): 0}, actor="a", reason="", target="x", confirmed=True)


def test_terminate_and_reactivate(store: Metastore) -> None:
    from metastore import SourceTerminated

    store.set_control("src", "terminating")
    assert store.mark_terminated("src")
    assert store.control("src").terminated
    with pytest.raises(SourceTerminated):
        store.set_control("src", "running")
    with pytest.raises(SourceTerminated):
        store.apply_source("src", {"name": "src", "x": 1}, "")
    assert store.segments("src") == [] and store.spec_versions("src")  # history stays queryable
    version, changed = store.apply_source("src", {"name": "src", "x": 1}, "", reactivate=True)
    assert changed and version == 2 and store.control("src").desired_state == "running"
    assert [v["version"] for v in store.spec_versions("src")] == [1, 2]


def test_every_control_change_notifies_listeners(store: Metastore, database_url: str) -> None:
    from metastore.listener import ControlListener

    listener = ControlListener(database_url, "src", wait_s=0.1).start()
    try:
        assert listener.changed.wait(10)  # set once LISTEN is in place
        listener.changed.clear()
        store.set_control("src", "suspended")
        assert listener.changed.wait(10)
    finally:
        listener.close()


def test_a_restarted_worker_with_the_same_id_is_shown_as_the_new_process(store: Metastore) -> None:
    """A pod's container restart keeps the worker id, the host name and pid 1: the row must show
    the new process's version and start time (the STUCK check counts from the start)."""
    first = datetime(2026, 11, 25, 8, 0, tzinfo=UTC)
    store.heartbeat("src", "pod-0", "pod-0", 1, "0.1.0", "running", ["events[0]"], 1, started_at=first)
    store.heartbeat("src", "pod-0", "pod-0", 1, "0.1.0", "running", ["events[0]"], 1, started_at=first)
    restarted = first + timedelta(hours=2)
    store.heartbeat("src", "pod-0", "pod-0", 1, "0.2.0", "starting", [], 1, started_at=restarted)
    [row] = store.live_workers("src")
    assert (row["version"], row["state"], row["started_at"]) == ("0.2.0", "starting", restarted)
    store.heartbeat("src", "pod-0", "pod-0", 1, "0.2.0", "running", ["events[1]"], 1)  # no start given: kept
    [row] = store.live_workers("src")
    assert (row["started_at"], row["partitions"]) == (restarted, ["events[1]"])


def test_a_heartbeat_carries_the_partitions_waiting_for_the_schema_registry(store: Metastore) -> None:
    """What `ingest status` shows as WAITING_FOR_SCHEMA_REGISTRY: written with each beat, gone
    with the first beat after the wait, the error redacted like every error report."""
    error = "schema registry http://reg:secret@registry:8081 did not answer for schema id 7: Connection refused"
    store.heartbeat(
        "src", "pod-0", "pod-0", 1, "0.1.0", "running", ["events[0]", "events[1]"], 1,
        registry_waiting=["events[1]"], registry_error=error,
    )  # fmt: skip
    [row] = store.live_workers("src")
    assert row["registry_waiting"] == ["events[1]"]
    assert "did not answer for schema id 7" in row["registry_error"] and "secret" not in row["registry_error"]
    store.heartbeat("src", "pod-0", "pod-0", 1, "0.1.0", "running", ["events[0]", "events[1]"], 1)
    [row] = store.live_workers("src")
    assert (row["registry_waiting"], row["registry_error"]) == ([], None)
