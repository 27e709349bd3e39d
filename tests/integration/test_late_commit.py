"""A publish whose connection broke while it waited on PostgreSQL, and whose server session
committed after the worker had looked the split up and found nothing: the worker's retry is
answered with the segment, and the segment's files are kept (real PostgreSQL, real files).

Only the client's side of the connection is broken (a loopback proxy cuts it), as a lost
network path does: the server's session survives, unlike one ended by pg_terminate_backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ingest.builder.job import BuildResult
from ingest.builder.queue import BuildQueue
from ingest.builder.registration import BuildRegistrar, Registrar
from ingest.publish.publisher import Publisher
from ingest.publish.queue import PublishQueue
from ingest.publish.settle import Outcome, Published
from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import BuildRegistration, BuiltSegment, SegmentToPublish, TopicPartition
from ingest_dev.tcp_proxy import TcpProxy
from ingest_dev.testkit import wait_until
from metastore import Metastore
from metastore.errors import Session
from tests.kafka_splits import split_of

T0 = TopicPartition("events", 0)
WAIT_S = 60.0


class ArrowSegmentBuilder:
    """Writes one Parquet file per split with pyarrow (no Spark, no Kafka: a row per offset of
    its range), under a build registered first as the Spark builder's is."""

    def __init__(self, registrar: BuildRegistrar) -> None:
        self._registration = registrar

    def build_batch(self, splits: Sequence[SealedSplit], spec: SourceSpec) -> list[BuildResult]:
        build = uuid.uuid4()
        dirs = segment_store.build_dirs(spec.segment_store, spec.name, build)
        self._registration.register(
            BuildRegistration(build, spec.name, dirs.staging, dirs.data, dirs.rejects, tuple(s.id for s in splits)),
            splits,
        )
        results: list[BuildResult] = []
        for split in splits:
            uri = f"{dirs.data}/part-{split.id}.parquet"
            segment_store.ensure_parent(uri)
            fs, path = segment_store.filesystem(uri)
            offsets = range(split.start, split.end)
            rows = pa.table(
                {
                    "_topic": [split.tp.topic] * len(offsets),
                    "_partition": pa.array([split.tp.partition] * len(offsets), pa.int32()),
                    "_offset": pa.array(offsets, pa.int64()),
                }
            )
            pq.write_table(rows, path, filesystem=fs)
            results.append(BuiltSegment(split.id, dirs.data, (uri,), split.offsets, fs.get_file_info(path).size))
        return results


class LookupHook:
    """The publisher's metastore, calling ``after_lookup`` once a lookup has answered."""

    def __init__(self, store: Metastore, after_lookup: Callable[[int | None], None]) -> None:
        self._store = store
        self._after_lookup = after_lookup
        self.lookups: list[int | None] = []

    def publish(self, item: SegmentToPublish) -> int:
        return self._store.publish(item)

    def end_session(self, session: Session) -> bool:
        """Answers as if the session were gone without ending it: what a publisher behind a
        transaction pooler gets (the pid it knows names a pooled connection, not the orphan).
        The idempotent publish, not the ended session, keeps the retry safe here."""
        return True

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        found = self._store.segment_for_split(split_id)
        self.lookups.append(found)
        self._after_lookup(found)
        return found


@pytest.fixture
def admin(database_url: str) -> Iterator[Metastore]:
    with Metastore(database_url) as store:
        yield store


def test_a_publish_committed_by_an_orphaned_session_is_answered_and_its_files_kept(
    admin: Metastore, database_url: str, tmp_path: Path
) -> None:
    admin.apply_source("src", {"name": "src"}, "name = 'src'")
    admin.register_partitions("src", "events", [0], "earliest")
    claim = admin.claim_from("src", "w1", [T0], start=0)[T0]
    spec = SourceSpec(
        name="src",
        topics=("events",),
        schema=(("ts", "timestamp"),),
        event_time="ts",
        segment_store=f"file://{tmp_path / 'store'}",
    )
    split = split_of(T0, 0, 10, serial=claim.serial)
    port = int(str(conninfo_to_dict(database_url)["port"]))

    with (
        TcpProxy(port) as proxy,
        Metastore(make_conninfo(database_url, port=proxy.port)) as through_proxy,
        Metastore(database_url) as registry,
        Metastore(database_url) as watcher,
        psycopg.connect(database_url) as locker,  # its open transaction holds the row lock
        psycopg.connect(database_url, autocommit=True) as activity,
    ):
        locker.execute(
            "SELECT 1 FROM ingest_partitions WHERE source = 'src' AND topic = %s AND partition = %s FOR UPDATE",
            (T0.topic, T0.partition),
        )

        def release_after_the_lookup(found: int | None) -> None:
            # The lookup ran while the orphaned session still waited: it found nothing. Now
            # the lock goes, the orphan commits, and only then may the retry come.
            locker.rollback()
            wait_until(
                lambda: watcher.segment_for_split(split.id) is not None,
                WAIT_S,
                "the orphaned session to commit",
                interval=0.02,
            )

        hook = LookupHook(through_proxy, release_after_the_lookup)
        publisher = Publisher(hook, "src", "w1", backoff=Backoff(0.01, 0.05))
        builds = BuildQueue(ArrowSegmentBuilder(Registrar(registry, "w1")), threads=1, linger_s=0.0)
        publishes = PublishQueue(publisher)
        try:
            publishes.submit(split, builds.submit(split, spec), spec_version=1)
            waiting: list[int] = []

            def publish_waits_on_the_lock() -> bool:
                row = activity.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE '%ingest_publish_segment%'"
                ).fetchone()
                waiting.extend(row or ())
                return row is not None

            wait_until(publish_waits_on_the_lock, WAIT_S, "the publish to wait for the row lock", interval=0.02)
            assert proxy.cut() == 1  # the publisher's connection, and only its client side
            outcomes: list[Outcome] = []
            wait_until(
                lambda: outcomes.extend(publishes.poll()) or outcomes, WAIT_S, "the split's outcome", interval=0.02
            )
            orphan_alive = activity.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (waiting[0],)).fetchone()
        finally:
            publishes.close(timeout=30)
            builds.close(timeout=30)
            publishes.stop(timeout=30)

    segments = [s for s in admin.segments("src") if s["split_id"] == split.id]
    files = [Path(uri.removeprefix("file://")) for s in segments for uri in s["files"]]
    facts = {
        "outcome": type(outcomes[0]).__name__,
        "lookups": hook.lookups,
        "segments of the split": len(segments),
        "conflicts": admin.conflict_counts("src"),
        "files exist": bool(files) and all(f.exists() for f in files),
        "partition (serial, next_offset)": admin.partition_state("src", T0),
        "orphaned session survived": orphan_alive is not None,
    }
    assert facts == {
        "outcome": "Published",
        "lookups": [None],
        "segments of the split": 1,
        "conflicts": {},
        "files exist": True,
        "partition (serial, next_offset)": (claim.serial, 10),
        "orphaned session survived": True,
    }
    (outcome,) = outcomes
    assert isinstance(outcome, Published) and outcome.segment_id == segments[0]["id"]
    assert sum(pq.read_table(f).num_rows for f in files) == 10
