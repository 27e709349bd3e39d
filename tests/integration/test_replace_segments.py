"""Segment replacement (migrations/0017) and gc of replaced segments against a real PostgreSQL
and a local store: what the in-memory fake has no notion of (epochs, tables, concurrent
transactions, the grace period, files on disk)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.config import Settings
from ingest.ops.gc import collect_garbage
from ingest.ops.status import source_status
from ingest_common.model import TopicPartition
from metastore import Metastore, ReplaceRefused
from metastore.queries import query
from metastore.tables import TableKind, TableStore
from tests.integration.test_gc import Build, exists, source

T0 = TopicPartition("events", 0)


@pytest.fixture
def store(database_url: str) -> Metastore:
    return Metastore(database_url)


def publish(store: Metastore, uri: str, serial: int, start: int, end: int, rejects: bool = False) -> tuple[int, Build]:
    build = Build(store, "src", uri)
    item = build.item("src", 0, serial, start, end)
    if rejects:
        rejected = Build._write(f"{build.dirs.rejects}/part-r.parquet")
        item = replace(item, segment=replace(item.segment, rejects_files=(rejected,), rejects_count=1))
    return store.publish(item), build


def compact(store: Metastore, uri: str, old: list[int], rows: int) -> tuple[int, Build]:
    """A compaction: its build registered, its file written, then the replacement."""
    build = Build(store, "src", uri)
    sid = build.split_ids[0]
    new = store.replace_segments("src", sid, "compactor", old, build.dirs.data, [build.files[sid]], rows, 4)
    return new, build


def age_replacements(store: Metastore, seconds: float) -> None:
    conn = store._connection()
    with conn.transaction():
        conn.execute(
            "UPDATE ingest_segments SET replaced_at = replaced_at - make_interval(secs => %(s)s) "
            "WHERE replaced_by IS NOT NULL",
            {"s": seconds},
        )


def test_replaced_files_go_after_the_grace_period_and_never_one_a_current_segment_lists(
    store: Metastore, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, first = publish(store, uri, serial, 0, 10, rejects=True)
    b, second = publish(store, uri, serial, 10, 20)
    new, compaction = compact(store, uri, [a, b], 20)
    [listed] = [s for s in store.segments("src") if s["id"] == new]
    carried = listed["rejects_files"]
    assert len(carried) == 1 and listed["rejects_count"] == 1
    old_files = [first.files[first.split_ids[0]], second.files[second.split_ids[0]]]

    # Within the grace period: a reader that listed the old segments can still read them.
    waiting = collect_garbage(store, "src", grace_s=3600)
    assert (waiting.replaced, waiting.replaced_waiting, waiting.deleted) == (0, 2, [])
    assert all(exists(f) for f in old_files)

    age_replacements(store, 7200)
    dry = collect_garbage(store, "src", grace_s=3600, dry_run=True)
    assert sorted(dry.deleted) == sorted(old_files) and all(exists(f) for f in old_files)
    done = collect_garbage(store, "src", grace_s=3600)
    assert sorted(done.deleted) == sorted(old_files) and done.replaced == 2 and done.replaced_waiting == 0
    assert not any(exists(f) for f in old_files)
    # The rejects file the replacement carries, and the replacement's own file, stay.
    assert exists(carried[0]) and exists(compaction.files[compaction.split_ids[0]])
    assert collect_garbage(store, "src", grace_s=3600).replaced == 0


def test_a_replacement_carries_the_holes_of_the_segments_it_replaces(store: Metastore, tmp_path: Path) -> None:
    """The holes (offsets with no record) of the old segments add up in their replacement; one
    old segment without a count (published by an earlier release) leaves it none."""
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    ids = []
    for start, holes in ((0, 2), (10, 3), (20, None), (30, 1)):
        item = Build(store, "src", uri).item("src", 0, serial, start, start + 10)
        segment = replace(item.segment, row_count=10 - (holes or 0), holes=holes)
        ids.append(store.publish(replace(item, segment=segment)))
    counted, _ = compact(store, uri, ids[:2], 15)
    uncounted, _ = compact(store, uri, ids[2:], 19)
    holes = {s["id"]: s["holes"] for s in store.current_segments("src")}
    assert holes == {counted: 5, uncounted: None}


def test_a_compaction_that_dies_before_its_replacement_leaves_nothing_visible_and_gc_cleans_it(
    store: Metastore, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, first = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    dead = Build(store, "src", uri)  # registered and written, never replaced
    before = store.segments("src")
    result = collect_garbage(store, "src", grace_s=0)
    assert result.abandoned == 1 and dead.files[dead.split_ids[0]] in result.deleted
    assert store.segments("src") == before and exists(first.files[first.split_ids[0]])
    # The compactor wakes up: its replacement is refused, nothing changes.
    sid = dead.split_ids[0]
    with pytest.raises(ReplaceRefused) as refused:
        store.replace_segments("src", sid, "compactor", [a, b], dead.dirs.data, [dead.files[sid]], 20, 4)
    assert refused.value.reason == "abandoned"
    assert store.segments("src") == before


def test_a_replacement_after_a_reset_keeps_the_epoch_of_the_ranges_it_replaces(
    store: Metastore, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, _ = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    store.reset_offsets("src", {T0: 0}, actor="t", reason="replay", target="offset", confirmed=True)
    again = store.claim_from("src", "w", [T0], start=0)[T0].serial
    replayed, _ = publish(store, uri, again, 0, 10)  # epoch 1 starts at 0 too
    new, _ = compact(store, uri, [a, b], 20)
    ranges = {s["id"]: s["ranges"] for s in store.segments("src")}
    assert ranges == {
        replayed: [{"topic": "events", "partition": 0, "start": 0, "end": 10, "epoch": 1}],
        new: [{"topic": "events", "partition": 0, "start": 0, "end": 20, "epoch": 0}],
    }
    assert store.partition_state("src", T0) == (again, 10)


def test_a_source_that_feeds_a_table_replaces_and_its_table_sees_the_replacement_pending(
    store: Metastore, database_url: str, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, _ = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    with TableStore(database_url) as tables:
        tables.enable("src", TableKind.DATA, "none")
        tables.record_commit("src", TableKind.DATA, 1, [a, b], None, datetime.now(UTC))
        new, _ = compact(store, uri, [a, b], 20)
        [pending] = tables.pending("src", TableKind.DATA, 10)
        assert (pending.id, pending.supersedes) == (new, (a, b))


def test_two_compactors_replacing_at_once_one_waits_and_is_refused(
    store: Metastore, database_url: str, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, _ = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    mine, theirs = Build(store, "src", uri), Build(store, "src", uri)
    outcome: list[object] = []
    with Metastore(database_url) as zombie:

        def late() -> None:
            sid = theirs.split_ids[0]
            try:
                outcome.append(zombie.replace_segments("src", sid, "z", [b, a], theirs.dirs.data, [], 20, 4))
            except ReplaceRefused as exc:
                outcome.append(exc.reason)

        conn = store._connection()
        with conn.transaction():
            sid = mine.split_ids[0]
            params = {
                "source": "src", "split_id": sid, "worker": "c", "old_ids": [a, b], "location": mine.dirs.data,
                "files": [mine.files[sid]], "row_count": 20, "size_bytes": 4,
            }  # fmt: skip
            row = conn.execute(query("replace_segments"), params).fetchone()
            assert row is not None and row["segment_id"] is not None
            thread = threading.Thread(target=late)
            thread.start()
            thread.join(1.0)
            assert thread.is_alive(), "the second replacement must wait for the old segments' rows"
        thread.join(30)
    assert outcome == ["replaced"]
    assert list(store.current_ranges("src")) == [row["segment_id"]]


def test_an_unknown_split_id_is_refused_not_published(store: Metastore, tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    a, _ = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    with pytest.raises(ReplaceRefused) as refused:
        store.replace_segments("src", uuid.uuid4(), "c", [a, b], uri, [], 20, 0)
    assert refused.value.reason == "unregistered"


def test_status_shows_the_replacement_as_the_last_segment_and_a_reset_records_it(
    store: Metastore, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    serial = source(store, "src", uri)
    no_kafka = Settings(database_url=store.url, kafka_bootstrap="")

    def last_segment() -> object:
        [partition] = source_status(store, no_kafka, "src")["partitions"]
        return partition["last_segment_id"]

    a, _ = publish(store, uri, serial, 0, 10)
    b, _ = publish(store, uri, serial, 10, 20)
    c, _ = publish(store, uri, serial, 20, 30)
    # A replacement of earlier segments leaves the last one alone.
    first, _ = compact(store, uri, [a, b], 20)
    assert last_segment() == c
    # One of the last segment: the replacement, then the replacement of that replacement.
    second, _ = compact(store, uri, [first, c], 30)
    assert last_segment() == second and second in {s["id"] for s in store.segments("src")}
    d, _ = publish(store, uri, serial, 30, 40)
    assert last_segment() == d
    third, _ = compact(store, uri, [second, d], 40)
    assert last_segment() == third
    # A reset ends the epoch at the current segment: later publishes are after it.
    store.reset_offsets("src", {T0: 0}, actor="t", reason="replay", target="offset", confirmed=True)
    [reset] = store.recent_resets("src")
    assert reset["partitions"][0]["last_segment_id"] == third
