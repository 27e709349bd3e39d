"""An upsert table (``[table] mode = "upsert"``) is the last state per key of the published
segments' changes, merged once each, against a real PostgreSQL (the metastore and its Iceberg
catalog), Spark's MERGE INTO (Iceberg's runtime) and pyiceberg reading the table back: inserts,
updates, deletes, keys on two partitions, a compaction of merged and unmerged segments, a
committer that died between its swap and its record, a zombie whose base moved, and the
maintenance that folds the delete files back. The segments are published as a worker
publishes them (their files written here, in the columns a build of an upsert source writes:
tests/integration/test_upsert_build.py checks those against Spark's build)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from ingest.segments.store import build_dirs
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest.spec.table import OP_DELETE, OP_UPSERT, TableMode, TableSettings
from ingest.table import upsert as upsert_module
from ingest.table.catalog import identifier, source_catalog
from ingest.table.config import PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.merge import TABLE_PARTITION_COLUMN, delete_files
from ingest.table.status import table_status
from ingest_common.model import BuildRegistration, BuiltSegment, OffsetRange, PublishRange, SegmentToPublish
from ingest_dev.iceberg_spark import spark_table
from metastore.tables import TableKind
from metastore.upserts import UpsertStore
from tests.integration.iceberg_harness import DAY0, T0, Source, audit_findings, committer, compact, spark_like

# A change: (key, user) upserts the key's row; (key, None) deletes it; (None, None) is a
# Debezium tombstone whose key was not decoded (it changes nothing).
Change = tuple[int | None, str | None]


class UpsertSource(Source):
    """A source with an upsert table keyed by ``key`` (a long column, ``id`` unless given),
    whose segments hold changes."""

    def __init__(self, *args: Any, key: str = "id", **kwargs: Any) -> None:
        self.key = key
        super().__init__(*args, **kwargs)

    def apply(self) -> None:
        self.columns = {self.key: "long", "user": "string", "ts": "timestamp"}
        doc = {
            "name": self.name,
            "topics": [T0.topic],
            "schema": self.columns,
            "event_time": "ts",
            "segment_store": self.root,
        }
        spec = spec_from_dict(doc)
        spec = replace(spec, table=TableSettings(mode=TableMode.UPSERT, key=(self.key,)))
        self.version, _ = self.store.apply_source(self.name, spec.to_json(), "")
        self.log: list[tuple[int, int, Change]] = []

    def publish_changes(self, changes: list[Change], partition: int = 0, when: int = 0) -> int:
        """One segment of ``changes`` at the partition's next offsets, Kafka timestamps from
        ``when`` seconds after DAY0 on."""
        tp = type(T0)(T0.topic, partition)
        build, split = uuid.uuid4(), uuid.uuid4()
        dirs = build_dirs(self.root, self.name, build)
        self.store.register_build(
            "w", BuildRegistration(build, self.name, dirs.staging, dirs.data, dirs.rejects, (split,))
        )
        start = self.next[tp]
        offsets = list(range(start, start + len(changes)))
        stamps = [DAY0 + timedelta(seconds=when + i) for i in range(len(changes))]
        data: dict[str, list[Any]] = {
            "_topic": [T0.topic] * len(changes),
            "_partition": [partition] * len(changes),
            "_offset": offsets,
            "_timestamp": stamps,
            "_key": [None if k is None else str(k).encode() for k, _ in changes],
            self.key: [k for k, _ in changes],
            "user": [u for _, u in changes],
            "ts": stamps,
            "_op": [OP_UPSERT if u is not None else OP_DELETE for _, u in changes],
        }
        schema = spark_like(self.columns).append(pa.field("_op", pa.string()))
        files = (self._write(f"{dirs.data}/part-00000-{split}.parquet", pa.table(data, schema)),)
        segment = BuiltSegment(split_id=split, location=dirs.data, files=files, row_count=len(changes), size_bytes=1)
        segment_id = self.store.publish(
            SegmentToPublish(
                self.name,
                self.version,
                "w",
                segment,
                (PublishRange(OffsetRange(tp, start, start + len(changes)), self.serials[tp]),),
            )
        )
        self.next[tp] = start + len(changes)
        self.log += [(partition, o, c) for o, c in zip(offsets, changes, strict=True)]
        return segment_id

    def expected(self) -> dict[int, str]:
        """The last state per key, computed from the produced log (keys on one partition each)."""
        state: dict[int, str] = {}
        for _partition, _offset, (key, user) in sorted(self.log, key=lambda e: e[:2]):
            if key is None:
                continue
            if user is None:
                state.pop(key, None)
            else:
                state[key] = user
        return state


@pytest.fixture
def src(database_url: str, tmp_path: Any) -> Iterator[UpsertSource]:
    source = UpsertSource(database_url, tmp_path.as_uri(), name="users", partitions=2)
    enable_table(database_url, source.name, PartitionBy.NONE, RejectsMode.NONE)
    yield source
    source.store.close()


def table_state(database_url: str, source: str, key: str = "id") -> dict[int, str]:
    """The table as pyiceberg reads it (position deletes applied): key -> user; a key twice fails."""
    catalog = source_catalog(database_url, source)
    rows = catalog.load_table(identifier(source, TableKind.DATA)).scan(selected_fields=(key, "user")).to_arrow()
    ids = rows[key].to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    return dict(zip(ids, rows["user"].to_pylist(), strict=True))


def spark_state(spark: Any, database_url: str, source: str, key: str = "id") -> dict[int, str]:
    from ingest.table.merge import merge_session_conf
    from ingest.table.spark_catalog import quoted, spark_table_name

    session = spark.newSession()
    for name, value in merge_session_conf(database_url).items():
        if name.startswith("spark.sql.catalog."):
            session.conf.set(name, value)
    rows = session.sql(f"SELECT {quoted(key)}, `user` FROM {spark_table_name(source)}").collect()
    assert len(rows) == len({r[key] for r in rows}), "a key is in the table twice"
    return {r[key]: r["user"] for r in rows}


def test_changes_are_merged_once_in_kafka_order_through_compaction_and_maintenance(
    database_url: str, src: UpsertSource, spark: Any
) -> None:
    src.publish_changes([(1, "a1"), (2, "b1"), (3, "c1"), (1, "a2")], partition=0)
    src.publish_changes([(10, "x1"), (11, "y1")], partition=1)
    with committer(database_url, src.name, batch=1) as c:
        first = c.commit_all()
        assert [r.seq for r in first] == [1], "at most batch_segments per partition, every partition at once"
        assert table_state(database_url, src.name) == src.expected() == {1: "a2", 2: "b1", 3: "c1", 10: "x1", 11: "y1"}
        merged = src.publish_changes([(2, None), (3, "c2")], partition=0)
        src.publish_changes([(2, "b3"), (4, "d1")], partition=0)
        c.commit_pending(TableKind.DATA)
        assert table_state(database_url, src.name) == src.expected()
        # A compaction replaces merged segments and an unmerged one by one: only the unmerged
        # offsets are merged from it.
        unmerged = src.publish_changes([(1, None), (4, "d2")], partition=0)
        compact(src, [merged, merged + 1, unmerged])
        upserts = c.upserts(TableKind.DATA)
        assert upserts is not None
        result = upserts.commit_batch()
        # Keys 1 and 4 only: the merged offsets of the replacement are not merged again.
        assert result is not None and result.keys == 2
        assert table_state(database_url, src.name) == src.expected() == {2: "b3", 3: "c2", 4: "d2", 10: "x1", 11: "y1"}
        assert c.commit_all() == []
        with UpsertStore(database_url) as store:
            state = store.upsert_state(src.name)
        assert dict(state.offsets) == {"events/0": 10, "events/1": 2}
        assert state.cross_partition_keys == 0
        name = f"ingest.ingest.{src.name}"
        assert delete_files(upserts.spark(), name) > 0, "the merges wrote position deletes"
        upserts.maintain_if_due(force=True)
        assert delete_files(upserts.spark(), name) == 0
        assert table_state(database_url, src.name) == spark_state(spark, database_url, src.name) == src.expected()
        table = c.load(TableKind.DATA)
        assert table is not None
        assert TABLE_PARTITION_COLUMN in table.schema().column_names
        assert "_op" not in table.schema().column_names
        assert audit_findings(database_url, src.name) == []
        # Another engine writes a second row for key 2: the audit names it.
        extra = table.scan(row_filter="id = 2").to_arrow()
        table.append(extra.cast(table.schema().as_arrow()))
        assert [line.split(":")[0] for line in audit_findings(database_url, src.name)] == ["upsert_duplicate_key"]


@pytest.mark.parametrize(
    ("name", "key"),
    [("dbz-mysql", "id"), ("order", "select")],
    ids=["a-dash", "keywords"],
)
def test_a_source_and_key_named_as_sql_would_not_read_them_merge(
    database_url: str, tmp_path: Any, spark: Any, name: str, key: str
) -> None:
    """Source names are ``[a-z][a-z0-9_-]{0,62}``, columns ``[A-Za-z][A-Za-z0-9_]*``: a source
    ``dbz-mysql`` (unquoted, Spark reads ``dbz - mysql``), a source ``order`` keyed by a column
    ``select``: reserved words, which Spark takes unquoted as names only while
    ``spark.sql.ansi.enforceReservedKeywords`` is off (its default; a spark-defaults.conf may
    turn it on, as here). Every statement the committer gives Spark names them: the merge, its
    branch's refs and snapshots, the delete files and the maintenance's procedures."""
    src = UpsertSource(database_url, tmp_path.as_uri(), name=name, partitions=2, key=key)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    try:
        src.publish_changes([(1, "a1"), (2, "b1"), (1, "a2")], partition=0)
        src.publish_changes([(10, "x1")], partition=1)
        with committer(database_url, src.name) as c:
            upserts = c.upserts(TableKind.DATA)
            assert upserts is not None
            upserts.spark().conf.set("spark.sql.ansi.enforceReservedKeywords", "true")
            assert [r.seq for r in c.commit_all()] == [1]
            src.publish_changes([(2, None), (3, "c1")], partition=0)
            src.publish_changes([(10, "x2")], partition=1)
            assert [r.seq for r in c.commit_all()] == [2]
            expected = {1: "a2", 3: "c1", 10: "x2"}
            assert table_state(database_url, src.name, key) == src.expected() == expected
            table = spark_table(src.name)
            assert delete_files(upserts.spark(), table) > 0, "the second merge wrote position deletes"
            upserts.maintain_if_due(force=True)
            assert delete_files(upserts.spark(), table) == 0
        assert spark_state(spark, database_url, src.name, key) == expected
        assert audit_findings(database_url, src.name) == []
    finally:
        src.store.close()


def test_a_key_on_two_partitions_is_counted(database_url: str, src: UpsertSource) -> None:
    src.publish_changes([(7, "p0"), (None, None)], partition=0, when=0)
    src.publish_changes([(7, "p1"), (8, "q"), (None, None)], partition=1, when=5)
    with committer(database_url, src.name) as c:
        c.commit_all()
        # The later Kafka timestamp wins across partitions.
        assert table_state(database_url, src.name) == {7: "p1", 8: "q"}
        src.publish_changes([(8, "q0")], partition=0, when=10)
        c.commit_pending(TableKind.DATA)
        assert c.metrics.registry.get_sample_value("ingest_table_cross_partition_keys", {"source": src.name}) == 2
    with UpsertStore(database_url) as store:
        assert store.upsert_state(src.name).cross_partition_keys == 2
    status = table_status(database_url, src.name)["tables"][0]
    assert status["upsert"]["cross_partition_keys"] == 2
    assert status["segments_behind"] == 0
    assert [line.split(":")[0] for line in audit_findings(database_url, src.name)] == ["cross_partition_keys"]


def test_a_commit_swapped_and_not_recorded_is_reconciled_never_merged_twice(
    database_url: str, src: UpsertSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    src.publish_changes([(1, "a1"), (2, "b1")])
    with committer(database_url, src.name) as c:
        with monkeypatch.context() as m:
            # What a committer that recorded after its swap and died between the two leaves.
            m.setattr(upsert_module, "fence_upsert", lambda conn, commit, url: None)
            upserts = c.upserts(TableKind.DATA)
            assert upserts is not None
            result = upserts.commit_batch()
            assert result is not None and result.seq == 1
        with UpsertStore(database_url) as store:
            assert store.upsert_state(src.name).seq == 0
        src.publish_changes([(1, None), (3, "c1")])
        assert [r.seq for r in c.commit_all()] == [2]
    with UpsertStore(database_url) as store:
        state = store.upsert_state(src.name)
    assert (state.seq, dict(state.offsets)) == (2, {"events/0": 4})
    assert table_state(database_url, src.name) == src.expected() == {2: "b1", 3: "c1"}


def test_a_zombie_whose_base_moved_is_refused(
    database_url: str, src: UpsertSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    src.publish_changes([(1, "a1")])
    with committer(database_url, src.name) as zombie, committer(database_url, src.name) as live:
        zombie.commit_all()
        src.publish_changes([(1, "a2")])
        upserts = zombie.upserts(TableKind.DATA)
        assert upserts is not None
        # The zombie stages commit 2 on its branch, then freezes; another committer commits 2
        # (and 3) meanwhile.
        table = upserts._load()
        assert table is not None
        state = upserts.reconcile(table)
        ranges, _offsets, ids, files = upsert_module.batch_of(
            upserts.store.pending_ranges(src.name, state.offsets, 100)
        )
        staged = upserts._merge(table, state.seq + 1, files, ranges, ("id",))
        live.commit_all()
        src.publish_changes([(1, "a3")])
        live.commit_all()
        stale = upsert_module.UpsertCommit(
            src.name, TableKind.DATA, state.seq + 1, {"events/0": 2}, 0, staged.snapshot_id, DAY0, ids
        )
        # Refused by the swap's assertion on the head alone (the metastore's fence, which would
        # refuse it too, taken out), and by both.
        with monkeypatch.context() as m:
            m.setattr(upsert_module, "fence_upsert", lambda conn, commit, url: None)
            with pytest.raises(CommitFailedException):
                upserts._swap(staged.base_id, staged.snapshot_id, staged.branch, stale, 0)
        with pytest.raises(CommitFailedException):
            upserts._swap(staged.base_id, staged.snapshot_id, staged.branch, stale, 0)
    assert table_state(database_url, src.name) == {1: "a3"}
    with UpsertStore(database_url) as store:
        assert store.upsert_state(src.name).seq == 3


def test_the_spec_json_round_trips_the_upsert_settings() -> None:
    spec = spec_from_dict(
        {"name": "s", "topics": ["t"], "schema": {"id": "long", "ts": "timestamp"}, "event_time": "ts"}
    )
    spec = replace(spec, table=TableSettings(mode=TableMode.UPSERT, key=("id",)))
    assert SourceSpec.from_json(spec.to_json()).table == spec.table


def test_a_merge_that_fails_in_spark_is_retried_and_swaps_nothing(database_url: str, src: UpsertSource) -> None:
    from ingest.segments.store import filesystem
    from ingest.table.errors import MergeFailed
    from ingest.table.role import RETRIED

    src.publish_changes([(1, "a1")])
    with committer(database_url, src.name) as c:
        c.commit_all()  # the table exists, at commit 1
        for n in range(3):
            src.publish_changes([(2, f"b{n}")])
        files = sorted(f for s in src.store.segments(src.name)[1:] for f in s["files"])
        # The middle one: Spark reads it, the schema check (first and last files) does not.
        fs, path = filesystem(files[1])
        fs.delete_file(path)
        upserts = c.upserts(TableKind.DATA)
        assert upserts is not None
        with pytest.raises(MergeFailed) as failed:
            upserts.commit_batch()
        assert isinstance(failed.value, RETRIED)
    with UpsertStore(database_url) as store:
        assert store.upsert_state(src.name).seq == 1
    assert table_state(database_url, src.name) == {1: "a1"}
