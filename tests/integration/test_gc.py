"""gc and the split registry against a real PostgreSQL and a local store: gc deletes only
files under builds its own source registered, never what may still be published, never
through a symbolic link, whatever the store URI's spelling."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from pyarrow.fs import FileType

from ingest.ops.gc import collect_garbage
from ingest.segments.store import build_dirs, ensure_parent, filesystem
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from metastore import Metastore, PublishConflict
from metastore.errors import StoreOverlap
from tests.fixtures.servers import S3Server

T0 = TopicPartition("events", 0)


def spec(name: str, store: str) -> dict[str, object]:
    return {"name": name, "segment_store": store}


class Build:
    """A build registered like a worker's, with one file per split written after registering."""

    def __init__(
        self, store: Metastore, source: str, store_uri: str, splits: int = 1, retry_of: Build | None = None
    ) -> None:
        """``retry_of``: a retry of that build (its splits, registered again by a new build)."""
        self.id = uuid.uuid4()
        self.dirs = build_dirs(store_uri, source, self.id)
        self.split_ids = retry_of.split_ids if retry_of else tuple(uuid.uuid4() for _ in range(splits))
        self.registration = BuildRegistration(
            self.id, source, self.dirs.staging, self.dirs.data, self.dirs.rejects, self.split_ids
        )
        store.register_build("w", self.registration)
        self.files = {sid: self._write(f"{self.dirs.data}/part-{sid}.parquet") for sid in self.split_ids}
        self._write(f"{self.dirs.staging}/{self.split_ids[0]}.parquet")

    def write_late(self, name: str) -> str:
        """What a writer that outlived its job leaves: a file no segment lists, in the build's
        data directory."""
        return self._write(f"{self.dirs.data}/{name}")

    @staticmethod
    def _write(uri: str) -> str:
        ensure_parent(uri)
        fs, path = filesystem(uri)
        with fs.open_output_stream(path) as out:
            out.write(b"PAR1")
        return uri

    def item(self, source: str, split: int, serial: int, start: int, end: int) -> SegmentToPublish:
        sid = self.split_ids[split]
        seg = BuiltSegment(
            split_id=sid, location=self.dirs.data, files=(self.files[sid],), row_count=end - start, size_bytes=4
        )
        return SegmentToPublish(
            source=source,
            spec_version=1,
            worker_id="w",
            segment=seg,
            ranges=(PublishRange(OffsetRange(T0, start, end), serial),),
        )


def age(store: Metastore, build: Build, seconds: float) -> None:
    """Move the build's registration (and its splits' and its last sweep, if any) ``seconds``
    into the past: how a grace period passes here without waiting for it."""
    conn = store._connection()
    with conn.transaction():
        conn.execute(
            "UPDATE ingest_builds SET created_at = created_at - make_interval(secs => %(s)s), "
            "swept_at = swept_at - make_interval(secs => %(s)s) WHERE id = %(id)s",
            {"s": seconds, "id": build.id},
        )
        conn.execute(
            "UPDATE ingest_splits SET registered_at = registered_at - make_interval(secs => %(s)s) "
            "WHERE build_id = %(id)s",
            {"s": seconds, "id": build.id},
        )


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type != FileType.NotFound)


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store: a local directory, or a prefix in the S3 API the tests reach (whose
    listings carry no modification times: gc must not need them)."""
    if request.param == "file":
        return f"file://{tmp_path}"
    s3: S3Server = request.getfixturevalue("s3_server")
    return s3.uri(f"gc-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(database_url: str) -> Metastore:
    return Metastore(database_url)


def source(store: Metastore, name: str, store_uri: str) -> int:
    store.apply_source(name, spec(name, store_uri), "")
    store.register_partitions(name, "events", [0], "earliest")
    return store.claim_from(name, "w", [T0], start=0)[T0].serial


def test_a_publish_delayed_past_gc_is_refused_and_nothing_is_lost(store: Metastore, root: str) -> None:
    uri = root
    serial = source(store, "src", uri)
    late = Build(store, "src", uri)
    result = collect_garbage(store, "src", grace_s=0)
    assert result.abandoned == 1 and not exists(late.files[late.split_ids[0]])
    # The metastore came back after gc: the publish is refused, the offsets do not move.
    with pytest.raises(PublishConflict) as refused:
        store.publish(late.item("src", 0, serial, 0, 10))
    assert refused.value.reason == "abandoned" and "read again" in str(refused.value)
    assert store.segments("src") == [] and store.partition_state("src", T0) == (serial, 0)
    assert store.conflict_counts("src") == {"abandoned": 1}
    # The records are read again: a new build of them publishes.
    again = Build(store, "src", uri)
    store.publish(again.item("src", 0, serial, 0, 10))
    assert store.partition_state("src", T0) == (serial, 10)


def test_a_publish_first_keeps_its_files_and_gc_sweeps_the_rest(store: Metastore, root: str) -> None:
    uri = root
    serial = source(store, "src", uri)
    build = Build(store, "src", uri, splits=2)
    store.publish(build.item("src", 0, serial, 0, 10))
    kept, dropped = (build.files[s] for s in build.split_ids)
    # The second split is still building: gc within the grace period leaves the build alone.
    young = collect_garbage(store, "src", grace_s=3600)
    assert (young.abandoned, young.swept, young.deleted, young.unswept) == (0, 0, [], 1)
    dry = collect_garbage(store, "src", grace_s=0, dry_run=True)
    assert dry.abandoned == 1 and dry.deleted == [] and exists(dropped)
    result = collect_garbage(store, "src", grace_s=0)
    assert (result.abandoned, result.swept, result.kept, result.unswept) == (1, 1, 1, 0)
    assert sorted(result.deleted) == sorted([dropped, f"{build.dirs.staging}/{build.split_ids[0]}.parquet"])
    assert exists(kept) and not exists(dropped) and not exists(f"{build.dirs.staging}/{build.split_ids[0]}.parquet")
    # Swept again (grace 0: at once): nothing new, so the build is closed and never listed again.
    again = collect_garbage(store, "src", grace_s=0)
    assert (again.swept, again.deleted, again.open) == (1, [], 0)
    assert collect_garbage(store, "src", grace_s=0).swept == 0 and exists(kept)


GRACE = 3600.0
AGED = 2 * GRACE


def test_a_file_written_after_a_sweep_is_deleted_by_a_later_one(store: Metastore, root: str) -> None:
    """A writer that outlived its job (a Spark task of a killed job, a registration retried
    after a lost reply) writes into a build's directories after gc swept it: a sweep one grace
    period later deletes it. Nothing is swept while a split of the build may still publish,
    however old the build, and the published file stays through every sweep."""
    serial = source(store, "src", root)
    build = Build(store, "src", root, splits=2)
    store.publish(build.item("src", 0, serial, 0, 10))
    published, dropped = (build.files[s] for s in build.split_ids)
    age(store, build, AGED)
    # The registration retried (its reply was lost): the second split is young again.
    store.register_build("w", build.registration)
    late = build.write_late("part-late.parquet")
    waiting = collect_garbage(store, "src", grace_s=GRACE)
    assert (waiting.abandoned, waiting.swept, waiting.building, waiting.open) == (0, 0, 1, 1)
    assert exists(late) and exists(dropped)

    age(store, build, AGED)
    first = collect_garbage(store, "src", grace_s=GRACE)
    assert (first.abandoned, first.swept, first.building, first.open) == (1, 1, 0, 1)
    assert late in first.deleted and not exists(dropped) and exists(published)
    later = build.write_late("part-later.parquet")
    # Its last sweep is younger than the grace period: not swept again yet.
    early = collect_garbage(store, "src", grace_s=GRACE)
    assert early.swept == 0 and exists(later)
    age(store, build, AGED)
    second = collect_garbage(store, "src", grace_s=GRACE)
    assert (second.swept, second.deleted, second.open) == (1, [later], 1)  # it found one: once more
    last = build.write_late("sub/part-last.parquet")
    age(store, build, AGED)
    third = collect_garbage(store, "src", grace_s=GRACE)
    assert (third.swept, third.deleted, third.open) == (1, [last], 1)
    age(store, build, AGED)
    closing = collect_garbage(store, "src", grace_s=GRACE)
    assert (closing.swept, closing.deleted, closing.open) == (1, [], 0)
    assert exists(published) and store.segments("src")[0]["files"] == [published]


def test_a_failed_build_whose_splits_moved_to_its_retry_waits_for_its_grace(store: Metastore, root: str) -> None:
    """A retry registers a failed build's splits, still building, in a new build: the failed
    build is left with no split, and its job may still be writing. It is swept only once its
    registration is a grace period old; the retry's published file stays."""
    serial = source(store, "src", root)
    failed = Build(store, "src", root)
    retry = Build(store, "src", root, retry_of=failed)
    young = collect_garbage(store, "src", grace_s=GRACE)
    assert (young.swept, young.deleted, young.open) == (0, [], 2) and exists(failed.files[failed.split_ids[0]])
    store.publish(retry.item("src", 0, serial, 0, 10))
    for build in (failed, retry):
        age(store, build, AGED)
    swept = collect_garbage(store, "src", grace_s=GRACE)
    assert swept.swept == 2 and not exists(failed.files[failed.split_ids[0]])
    assert exists(retry.files[retry.split_ids[0]])


def test_a_retry_of_abandoned_splits_waits_for_its_grace(store: Metastore, root: str) -> None:
    """Splits gc abandoned stay with the build they were abandoned in: a retry registering them
    has no split at all, its publish is refused, and it is swept only once its registration is
    a grace period old (its job may still be writing)."""
    serial = source(store, "src", root)
    stale = Build(store, "src", root)
    age(store, stale, AGED)
    first = collect_garbage(store, "src", grace_s=GRACE)
    assert (first.abandoned, first.swept) == (1, 1) and not exists(stale.files[stale.split_ids[0]])
    again = Build(store, "src", root, retry_of=stale)
    with pytest.raises(PublishConflict, match="abandoned"):
        store.publish(again.item("src", 0, serial, 0, 10))
    young = collect_garbage(store, "src", grace_s=GRACE)
    assert (young.swept, young.deleted) == (0, []) and exists(again.files[again.split_ids[0]])
    age(store, again, AGED)
    swept = collect_garbage(store, "src", grace_s=GRACE)
    assert swept.swept == 1 and not exists(again.files[again.split_ids[0]])


def test_two_gc_runs_never_sweep_one_build_at_once(store: Metastore, database_url: str, tmp_path: Path) -> None:
    """A sweep holds its build's row: another gc skips the build, and one that read the build
    before a sweep was recorded does not sweep it on that stale reading."""
    uri = f"file://{tmp_path}"
    source(store, "src", uri)
    build = Build(store, "src", uri)
    file = build.files[build.split_ids[0]]
    with Metastore(database_url) as other:
        conn = other._connection()
        with conn.transaction():
            conn.execute("SELECT id FROM ingest_builds WHERE id = %s FOR NO KEY UPDATE", (build.id,))
            held = collect_garbage(store, "src", grace_s=0)
            assert (held.abandoned, held.swept, held.unswept, held.open) == (1, 0, 1, 1) and exists(file)
    assert collect_garbage(store, "src", grace_s=0).swept == 1 and not exists(file)
    ran: list[int] = []
    assert not store.sweep_build("src", build.id, 0, lambda: ran.append(1) or 0)
    assert ran == []


def test_gc_reports_what_it_cannot_see_on_an_object_store(store: Metastore, root: str) -> None:
    """Incomplete multipart uploads are no objects: gc says so for an s3a:// source, and counts
    the builds where an uncommitted S3A magic-committer job left its manifests."""
    source(store, "src", root)
    build = Build(store, "src", root)
    magic = build.write_late("__magic_job-0/tasks/attempt_0/__base/part-0.parquet.pending")
    result = collect_garbage(store, "src", grace_s=0)
    assert result.uncommitted_jobs == 1 and magic in result.deleted and not exists(magic)
    if root.startswith("s3a://"):
        assert result.multipart_note is not None and "AbortIncompleteMultipartUpload" in result.multipart_note
    else:
        assert result.multipart_note is None


def test_gc_deletes_only_what_its_own_source_registered(store: Metastore, tmp_path: Path) -> None:
    """A source named "ingest" with the parent store of another source's store, as an older
    version allowed (today apply refuses it): its gc never reaches the other's files."""
    parent = f"file://{tmp_path}"
    source(store, "ingest", parent)
    conn = store._connection()
    with conn.transaction():  # an overlap stored before apply refused it
        conn.execute("INSERT INTO ingest_sources (name, version) VALUES ('victim', 1)")
        conn.execute(
            "INSERT INTO ingest_source_versions (source, version, spec, spec_text) VALUES ('victim', 1, %s::jsonb, '')",
            (f'{{"segment_store": "{parent}/ingest"}}',),
        )
    victim = Build(store, "victim", f"{parent}/ingest")
    stray = Path(tmp_path / "ingest" / "segments" / "not-registered" / "part-0.parquet")
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"PAR1")
    own = Build(store, "ingest", parent)
    result = collect_garbage(store, "ingest", grace_s=0)
    assert result.swept == 1 and not exists(own.files[own.split_ids[0]])
    assert exists(victim.files[victim.split_ids[0]]) and stray.exists()


def test_gc_never_follows_a_symbolic_link(store: Metastore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.parquet"
    precious.write_bytes(b"keep me")
    uri = f"file://{tmp_path / 'store'}"
    source(store, "src", uri)
    # Links inside a build directory: the links go, what they point to stays.
    inner = Build(store, "src", uri)
    data = Path(inner.dirs.data.removeprefix("file://"))
    (data / "link-dir").symlink_to(outside)
    (data / "link-file").symlink_to(precious)
    first = collect_garbage(store, "src", grace_s=0)
    assert first.swept == 1 and not data.exists()
    assert sorted(outside.iterdir()) == [precious] and precious.read_bytes() == b"keep me"
    assert collect_garbage(store, "src", grace_s=0).open == 0  # swept again: nothing left, closed
    # A link on the way to a build directory (``segments`` replaced by a link): nothing
    # under it is deleted; the build stays unswept and gc says so.
    later = Build(store, "src", uri)
    segments = tmp_path / "store" / "src" / "segments"
    segments.rename(tmp_path / "moved-segments")
    segments.symlink_to(outside)
    (outside / str(later.id)).mkdir()
    victim = outside / str(later.id) / f"part-{later.split_ids[0]}.parquet"
    victim.write_bytes(b"keep me too")
    second = collect_garbage(store, "src", grace_s=0)
    assert victim.read_bytes() == b"keep me too" and precious.exists()
    assert second.swept == 0 and second.unswept == 1 and second.open == 1
    assert len(second.unsafe) == 1 and "symbolic link" in second.unsafe[0]


@pytest.mark.parametrize("respelled", ["local://{p}", "{p}/", "file:{p}"])
def test_a_respelled_store_uri_keeps_published_segments(store: Metastore, tmp_path: Path, respelled: str) -> None:
    from ingest.spec.parse import spec_from_dict

    doc = {
        "name": "src",
        "topics": ["events"],
        "event_time": "ts",
        "schema": {"ts": "timestamp"},
        "segment_store": f"file://{tmp_path}",
    }
    first = spec_from_dict(doc)
    serial = source(store, "src", first.segment_store)
    build = Build(store, "src", first.segment_store)
    store.publish(build.item("src", 0, serial, 0, 10))
    second = spec_from_dict({**doc, "segment_store": respelled.format(p=tmp_path)})
    assert second.segment_store == first.segment_store
    store.apply_source("src", second.to_json(), "")
    collect_garbage(store, "src", grace_s=0)
    assert exists(build.files[build.split_ids[0]])


def test_overlapping_stores_are_refused_at_apply_naming_both(store: Metastore, tmp_path: Path) -> None:
    store.apply_source("ingest", spec("ingest", f"file://{tmp_path}"), "")
    store.apply_source("other", spec("other", f"file://{tmp_path}"), "")  # one store, two sources: fine
    with pytest.raises(StoreOverlap) as nested:
        store.apply_source("victim", spec("victim", f"file://{tmp_path}/ingest"), "")
    message = str(nested.value)
    assert "'victim'" in message and "'ingest'" in message and message.startswith("segment_store: ")
    with pytest.raises(StoreOverlap, match="'other'"):
        store.apply_source("deeper", spec("deeper", f"file://{tmp_path}/other/segments"), "")
    assert [r["name"] for r in store.list_sources()] == ["ingest", "other"]


def test_an_unregistered_split_with_files_is_refused(store: Metastore, tmp_path: Path) -> None:
    serial = source(store, "src", f"file://{tmp_path}")
    sid = uuid.uuid4()
    seg = BuiltSegment(
        split_id=sid, location=f"file://{tmp_path}/x", files=(f"file://{tmp_path}/x/a",), row_count=1, size_bytes=1
    )
    item = SegmentToPublish(
        source="src", spec_version=1, worker_id="w", segment=seg, ranges=(PublishRange(OffsetRange(T0, 0, 1), serial),)
    )
    with pytest.raises(PublishConflict) as refused:
        store.publish(item)
    assert refused.value.reason == "unregistered"
    # Offsets without records (no files) need no registration.
    empty = SegmentToPublish(
        source="src",
        spec_version=1,
        worker_id="w",
        segment=BuiltSegment(split_id=uuid.uuid4(), location="", files=(), row_count=0, size_bytes=0),
        ranges=(PublishRange(OffsetRange(T0, 0, 1), serial),),
    )
    assert store.publish(empty) > 0


def test_a_consumer_group_belongs_to_one_source(store: Metastore, tmp_path: Path) -> None:
    """Two sources in one group would split its partitions: refused at apply, naming both,
    whether the group is spelled out or is another source's default (ingest-<name>)."""
    from metastore.errors import GroupTaken

    store.apply_source("foo", spec("foo", f"file://{tmp_path}"), "")
    store.apply_source("bar", {**spec("bar", f"file://{tmp_path}"), "consumer_group": "shared"}, "")
    for name, group, owner in (("baz", "ingest-foo", "foo"), ("qux", "shared", "bar")):
        with pytest.raises(GroupTaken) as taken:
            store.apply_source(name, {**spec(name, f"file://{tmp_path}"), "consumer_group": group}, "")
        assert f"{group!r}" in str(taken.value) and f"{owner!r}" in str(taken.value)
    # A new version of the same source keeps its group; another group is fine.
    assert store.apply_source("bar", {**spec("bar", f"file://{tmp_path}"), "consumer_group": "shared", "x": 1}, "")[1]
    store.apply_source("baz", {**spec("baz", f"file://{tmp_path}"), "consumer_group": "own"}, "")
    assert sorted(r["name"] for r in store.list_sources()) == ["bar", "baz", "foo"]


def _replace_and_age(store: Metastore, compaction: Build, old: list[int], rows: int) -> int:
    """A compaction's replacement of ``old``, then its grace period passed."""
    sid = compaction.split_ids[0]
    new = store.replace_segments("src", sid, "c", old, compaction.dirs.data, [compaction.files[sid]], rows, 4)
    conn = store._connection()
    with conn.transaction():
        conn.execute(
            "UPDATE ingest_segments SET replaced_at = replaced_at - make_interval(secs => %(s)s) "
            "WHERE replaced_by IS NOT NULL",
            {"s": AGED},
        )
    return new


def is_dir(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type == FileType.Directory)


def test_gc_removes_the_directories_replaced_files_leave_empty_up_to_their_build(store: Metastore, root: str) -> None:
    serial = source(store, "src", root)
    first, second = Build(store, "src", root), Build(store, "src", root)
    nested = first.write_late("day=1/part-0.parquet")  # a file_partition level below the build
    item = first.item("src", 0, serial, 0, 10)
    a = store.publish(replace(item, segment=replace(item.segment, files=(*item.segment.files, nested))))
    b = store.publish(second.item("src", 0, serial, 10, 20))
    # The compaction writes under another store root: the old root's levels above the builds
    # hold nothing else afterwards, and still stay.
    compaction = Build(store, "src", f"{root}/moved")
    _replace_and_age(store, compaction, [a, b], 20)

    dry = collect_garbage(store, "src", grace_s=GRACE, dry_run=True)
    assert dry.dirs_removed == [] and exists(nested)
    result = collect_garbage(store, "src", grace_s=GRACE)
    assert result.replaced == 2 and not result.unsafe and not exists(nested)
    if root.startswith("file://"):
        removed = [f"{first.dirs.data}/day=1", first.dirs.data, second.dirs.data]
        assert sorted(result.dirs_removed) == sorted(removed) and not any(is_dir(d) for d in removed)
        assert is_dir(f"{root}/src/segments") and is_dir(compaction.dirs.data)
    else:  # an object store has no directories
        assert result.dirs_removed == []
    assert exists(compaction.files[compaction.split_ids[0]])


def test_gc_keeps_the_directory_of_a_build_with_a_split_still_building(store: Metastore, tmp_path: Path) -> None:
    """A registration retried after a lost reply makes a split of a build whose other split was
    published building again: its writer may still create files in the build's directory. And
    a directory a writer that outlived its job wrote into is not empty: it stays."""
    root = f"file://{tmp_path}"
    serial = source(store, "src", root)
    first, second = Build(store, "src", root, splits=2), Build(store, "src", root)
    a = store.publish(first.item("src", 0, serial, 0, 10))
    b = store.publish(second.item("src", 0, serial, 10, 20))
    store.register_build("w", first.registration)
    Path(first.files[first.split_ids[1]].removeprefix("file://")).unlink()  # not written yet
    late = second.write_late("part-late.parquet")
    _replace_and_age(store, Build(store, "src", root), [a, b], 20)
    result = collect_garbage(store, "src", grace_s=GRACE)
    assert (result.replaced, result.dirs_removed, result.unsafe) == (2, [], [])
    assert is_dir(first.dirs.data) and not exists(first.files[first.split_ids[0]])
    assert exists(late) and not exists(second.files[second.split_ids[0]])
