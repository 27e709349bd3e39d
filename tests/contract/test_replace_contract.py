"""Segment replacement (compaction, migrations/0017) against the in-memory fake
(tests.fake_compaction, mixed into MemoryMetastore) and the real PostgreSQL Metastore: the
replacement covers exactly the old segments' offsets, refuses anything no longer current,
never moves next_offset, and only current segments are listed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ingest_common.model import BuildRegistration, OffsetRange, TopicPartition
from metastore import Metastore, ReplaceRefused
from tests.contract.test_store_contract import claim, publish
from tests.fake_metastore import MemoryMetastore

P0 = TopicPartition("t", 0)
P1 = TopicPartition("t", 1)


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


def register(store: Any) -> uuid.UUID:
    """A compaction's build of one split, registered before it writes (as the compactor does)."""
    split_id, build = uuid.uuid4(), uuid.uuid4()
    root = f"file:///st/src/{{}}/{build}"
    store.register_build(
        "compactor",
        BuildRegistration(
            build, "src", root.format("_staging"), root.format("segments"), root.format("rejects"), (split_id,)
        ),
    )
    return split_id


def replace(store: Any, old: list[int], rows: int | None = None, split_id: uuid.UUID | None = None) -> int:
    split_id = split_id or register(store)
    return int(
        store.replace_segments(
            "src",
            split_id,
            "compactor",
            old,
            f"file:///st/src/segments/{split_id}",
            ["f.parquet"],
            len(old) if rows is None else rows,
            100,
        )
    )


def three_segments(store: Any) -> list[int]:
    """P0 [0, 5) [5, 9) [9, 20) and P1 [0, 3); each test publish holds one row."""
    claim(store, "w1", [P0, P1])
    return [
        publish(store, (P0, 1, 0, 5)),
        publish(store, (P0, 1, 5, 9)),
        publish(store, (P0, 1, 9, 20)),
        publish(store, (P1, 1, 0, 3)),
    ]


def test_a_replacement_covers_the_union_of_the_old_ranges_and_they_are_listed_no_more(store: Any) -> None:
    a, b, c, d = three_segments(store)
    new = replace(store, [b, a, c])
    assert store.current_ranges("src") == {d: (OffsetRange(P1, 0, 3),), new: (OffsetRange(P0, 0, 20),)}
    # next_offset and the serial are the publish's, untouched.
    assert store.partition_state("src", P0) == (1, 20)
    # The partition goes on: the next publish is checked against the stored offset as before.
    e = publish(store, (P0, 1, 20, 30))
    assert set(store.current_ranges("src")) == {d, new, e}


def test_a_second_replacement_of_the_same_segments_is_refused_and_writes_nothing(store: Any) -> None:
    """A zombie compactor: another one replaced the segments first."""
    a, b, c, _ = three_segments(store)
    first = replace(store, [a, b])
    before = store.current_ranges("src")
    for old in ([a, b], [b, c]):
        with pytest.raises(ReplaceRefused) as refused:
            replace(store, old)
        assert refused.value.reason == "replaced"
    assert store.current_ranges("src") == before
    # The replacement itself is current and may be replaced in turn.
    second = replace(store, [first, c], rows=3)
    assert store.current_ranges("src")[second] == (OffsetRange(P0, 0, 20),)


@pytest.mark.parametrize(
    ("pick", "rows", "reason"),
    [
        (lambda ids: [ids[0], ids[2]], None, "ranges"),  # [0, 5) and [9, 20): a hole between
        (lambda ids: [ids[0], ids[1]], 3, "row_count"),  # the new files hold one row too many
        (lambda ids: [ids[0], 999_999], None, "missing"),
        (lambda ids: [], 0, "missing"),
    ],
)
def test_a_replacement_that_would_change_what_is_published_is_refused(
    store: Any, pick: Any, rows: int | None, reason: str
) -> None:
    ids = three_segments(store)
    before = store.current_ranges("src")
    with pytest.raises(ReplaceRefused) as refused:
        replace(store, pick(ids), rows)
    assert refused.value.reason == reason
    assert store.current_ranges("src") == before


def test_a_replacement_needs_its_split_registered_and_is_idempotent_by_it(store: Any) -> None:
    a, b, c, _ = three_segments(store)
    with pytest.raises(ReplaceRefused) as refused:
        replace(store, [a, b], split_id=uuid.uuid4())
    assert refused.value.reason == "unregistered"
    split_id = register(store)
    new = replace(store, [a, b], split_id=split_id)
    # A retry after a lost reply answers with the segment, whatever the old segments are now.
    assert replace(store, [a, b], split_id=split_id) == new
    assert replace(store, [b, c], split_id=split_id) == new
    assert store.segment_for_split(split_id) == new
