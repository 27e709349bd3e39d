"""The build and publish stages, chained as the loop chains them, and the publisher, against
fakes of the builder and the metastore."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from ingest.builder.queue import BATCH_QUIET_S, BUILD_RETRY
from ingest.publish.publisher import Publisher
from ingest.publish.settle import Conflicted, Failed, Killed, Outcome, Published, SplitFiles
from ingest.spec.holder import SpecHolder
from ingest.spec.model import SourceSpec
from ingest.splits.split import SealedSplit
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, SegmentToPublish, TopicPartition
from ingest_dev.testkit import wait_until
from metastore.errors import CommitOutcomeUnknown, Session
from tests.fake_metastore import FakeStore
from tests.fakes import FakeBuilder, FakeClock, make_split
from tests.stages import Stages as Pipeline

P0 = TopicPartition("t", 0)
P1 = TopicPartition("t", 1)
SPEC = SourceSpec(
    name="s", topics=("t",), schema=(("ts", "timestamp"),), event_time="ts", segment_store="file:///tmp/unused"
)


@pytest.fixture
def store() -> FakeStore:
    # Both partitions claimed, their start pinned at 0 (as a claim stores it before any read).
    return FakeStore(serials={P0: 1, P1: 1}, next_offsets={P0: 0, P1: 0})


@pytest.fixture
def builder(store: FakeStore) -> FakeBuilder:
    return FakeBuilder().register_with(store)


@pytest.fixture
def pipeline(store: FakeStore, builder: FakeBuilder) -> Iterator[Pipeline]:
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    p = Pipeline(
        builder,
        publisher,
        SpecHolder(SPEC, 1),
        build_threads=2,
        build_attempts=2,
        build_retry=BUILD_RETRY.on(FakeClock()),
        batch_linger_s=0.0,
    )
    yield p
    p.close(timeout=5)


def drain(pipeline: Pipeline, n: int, timeout: float = 5.0) -> list[Outcome]:
    outcomes: list[Outcome] = []
    wait_until(
        lambda: outcomes.extend(pipeline.poll()) or len(outcomes) >= n,
        timeout,
        f"{n} outcome(s)",
        interval=0.005,
        detail=lambda: f"{outcomes}",
    )
    assert len(outcomes) == n, outcomes
    return outcomes


def built(builder: FakeBuilder, split: SealedSplit) -> bool:
    return any(b.id == split.id for b in builder.built)


def test_a_partition_publishes_in_offset_order_even_when_a_later_split_builds_first(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore
) -> None:
    gate = threading.Event()
    builder.gates[0] = gate
    first, second = make_split(P0, 0, 10), make_split(P0, 10, 20)
    pipeline.submit(first)
    wait_until(lambda: 0 in builder.started, 5, "the first split's build", interval=0.005)
    pipeline.submit(second)  # the other build thread takes it
    wait_until(lambda: built(builder, second), 5, "the later split to be built", interval=0.005)
    assert store.segments == {}  # the second is built but must wait for the first
    gate.set()
    outcomes = drain(pipeline, 2)
    assert [o.split.start for o in outcomes] == [0, 10]
    assert all(isinstance(o, Published) for o in outcomes)
    assert [b.start for b in builder.built] == [10, 0]  # built before the earlier split was, let alone published
    assert list(store.segments) == [first.id, second.id]
    assert store.next_offsets[P0] == 20


def test_killing_one_partition_leaves_the_others_untouched(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore
) -> None:
    gate = threading.Event()
    builder.gates[0] = gate
    builder.gates[100] = gate
    store.next_offsets[P1] = 100
    pipeline.submit(make_split(P0, 0, 10))
    pipeline.submit(make_split(P1, 100, 110))
    assert pipeline.kill([P0], "revoke") == 1
    gate.set()
    outcomes = {o.split.tp: o for o in drain(pipeline, 2)}
    assert isinstance(outcomes[P0], Killed) and outcomes[P0].reason == "revoke"
    assert isinstance(outcomes[P1], Published)
    assert store.next_offsets == {P0: 0, P1: 110}


def test_a_zombie_split_is_refused_and_its_successors_are_killed(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore
) -> None:
    gate = threading.Event()
    builder.gates[0] = gate
    first, second = make_split(P0, 0, 10), make_split(P0, 10, 20)
    pipeline.submit(first)
    pipeline.submit(second)
    store.serials[P0] = 2  # another worker claimed the partition meanwhile
    gate.set()
    outcomes = drain(pipeline, 2)
    assert isinstance(outcomes[0], Conflicted) and outcomes[0].conflict.reason == "serial"
    assert isinstance(outcomes[1], Killed) and outcomes[1].reason == "predecessor_failed"
    assert store.segments == {}
    assert first.id in builder.discarded  # its files never become visible
    assert outcomes[0].files is SplitFiles.DISCARDED  # every statement sent was answered


def test_a_split_not_starting_at_the_stored_offset_is_refused(pipeline: Pipeline, store: FakeStore) -> None:
    store.next_offsets[P0] = 5
    pipeline.submit(make_split(P0, 0, 10))
    (outcome,) = drain(pipeline, 1)
    assert isinstance(outcome, Conflicted) and outcome.conflict.reason == "offset"
    assert store.next_offsets[P0] == 5


def test_build_failures_are_retried_then_reported(pipeline: Pipeline, builder: FakeBuilder) -> None:
    builder.failures[0] = 1
    builder.failures[100] = 5
    pipeline.submit(make_split(P0, 0, 10))
    pipeline.submit(make_split(P1, 100, 110))
    outcomes = {o.split.tp: o for o in drain(pipeline, 2)}
    assert isinstance(outcomes[P0], Published)
    assert isinstance(outcomes[P1], Failed) and outcomes[P1].stage == "build"


def test_metastore_outage_is_retried_and_publishes_once(pipeline: Pipeline, store: FakeStore) -> None:
    store.unavailable_for = 3
    pipeline.submit(make_split(P0, 0, 10))
    (outcome,) = drain(pipeline, 1)
    assert isinstance(outcome, Published)
    assert len(store.segments) == 1 and store.next_offsets[P0] == 10


def test_unknown_commit_outcome_is_resolved_without_publishing_twice(pipeline: Pipeline, store: FakeStore) -> None:
    store.lose_commit_ack = 1
    pipeline.submit(make_split(P0, 0, 10))
    pipeline.submit(make_split(P0, 10, 20))
    outcomes = drain(pipeline, 2)
    assert all(isinstance(o, Published) for o in outcomes)
    assert len(store.segments) == 2 and store.next_offsets[P0] == 20


def test_a_split_committed_by_a_session_that_outlived_its_connection_is_answered_with_its_id(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore
) -> None:
    """The reply is lost while the publish waits on the server; the lookup finds nothing;
    then the orphaned session commits: the retry learns the split is published, and its id."""
    earlier = make_split(P0, 0, 5)
    pipeline.submit(earlier)
    drain(pipeline, 1)
    store.lose_reply = 1
    store.on_lookup = lambda _split_id: store.commit_orphans()
    split = make_split(P0, 5, 10)
    pipeline.submit(split)
    (outcome,) = drain(pipeline, 1)
    store.on_lookup = None
    assert isinstance(outcome, Published), outcome
    assert outcome.segment_id == store.segment_for_split(split.id) == 2  # the second segment's, not the first's
    assert list(store.segments) == [earlier.id, split.id] and store.next_offsets[P0] == 10
    assert builder.discarded == []


def _claimed_by_another_worker(store: FakeStore, _pipeline: Pipeline) -> None:
    store.serials[P0] = 2


def _revoked(_store: FakeStore, pipeline: Pipeline) -> None:
    pipeline.kill([P0], KillReason.REVOKE)


def _unexpected_error(store: FakeStore, _pipeline: Pipeline) -> None:
    store.publish_error = RuntimeError("injected: a bug")


@pytest.mark.parametrize(
    ("after_lookup", "expected"),
    [(_claimed_by_another_worker, Conflicted), (_revoked, Killed), (_unexpected_error, Failed)],
)
def test_after_an_unanswered_publish_the_split_files_are_left_to_gc_however_it_ends(
    pipeline: Pipeline,
    builder: FakeBuilder,
    store: FakeStore,
    after_lookup: Callable[[FakeStore, Pipeline], None],
    expected: type[Outcome],
) -> None:
    """The orphaned session may commit after the worker gave up (or never): only gc, asking
    the metastore, may delete the files of a split whose publish went unanswered."""
    store.lose_reply = 1
    store.on_lookup = lambda _split_id: after_lookup(store, pipeline)
    pipeline.submit(make_split(P0, 0, 10))
    (outcome,) = drain(pipeline, 1)
    assert isinstance(outcome, expected), outcome
    assert builder.discarded == []
    assert isinstance(outcome, Conflicted | Killed | Failed) and outcome.files is SplitFiles.LEFT_TO_GC
    assert store.segments == {} and len(store.orphans) == 1


@dataclasses.dataclass
class SilentStore(FakeStore):
    """The first publish gets no reply: the statement is still on its way to (or running in)
    its session, and commits right after the lookup unless the session was ended first."""

    calls: list[str] = dataclasses.field(default_factory=list)
    held: SegmentToPublish | None = None
    ending: bool = False

    def publish(self, item: SegmentToPublish) -> int:
        self.calls.append("publish")
        if len(self.calls) == 1:
            self.held = item
            raise CommitOutcomeUnknown("no reply", Session(4242, datetime.now(UTC)))
        return super().publish(item)

    def end_session(self, session: Session) -> bool:
        self.calls.append("end_session")
        if self.ending:  # gone, and the held statement with it
            self.held = None
            return True
        self.ending = True
        return False

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        self.calls.append("segment_for_split")
        found = super().segment_for_split(split_id)
        if self.held is not None:  # lands just after the lookup
            super().publish(self.held)
            self.held = None
        return found


def test_an_unknown_outcome_is_looked_up_only_once_its_session_has_ended() -> None:
    store = SilentStore(serials={P0: 1}, next_offsets={P0: 0})
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    pipeline = Pipeline(
        FakeBuilder().register_with(store), publisher, SpecHolder(SPEC, 1), build_threads=1, batch_linger_s=0.0
    )
    try:
        pipeline.submit(make_split(P0, 0, 10))
        (outcome,) = drain(pipeline, 1)
    finally:
        pipeline.close(timeout=5)
    # Looked up while the session lived, the split would be missing, the retry refused
    # (the late commit moved the offset) and the files of a published segment deleted.
    assert isinstance(outcome, Published), outcome
    assert store.calls == ["publish", "end_session", "end_session", "segment_for_split", "publish"]
    assert len(store.segments) == 1 and store.next_offsets[P0] == 10


def test_join_waits_for_everything_in_flight(pipeline: Pipeline, builder: FakeBuilder) -> None:
    gate = threading.Event()
    builder.gates[0] = gate
    pipeline.submit(make_split(P0, 0, 10))
    assert not pipeline.join(0.05)
    assert pipeline.inflight_count == 1
    gate.set()
    assert pipeline.join(5)
    assert pipeline.inflight_count == 0 and pipeline.inflight_bytes == 0


def test_splits_waiting_together_build_as_one_batch_and_only_failed_ones_are_retried(
    store: FakeStore, builder: FakeBuilder
) -> None:
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    gate = threading.Event()
    builder.gates[0] = gate
    builder.failures[30] = 1
    pipeline = Pipeline(
        builder,
        publisher,
        SpecHolder(SPEC, 1),
        build_threads=1,
        build_attempts=2,
        build_retry=BUILD_RETRY.on(FakeClock()),
        batch_linger_s=0.0,
    )
    try:
        pipeline.submit(make_split(P0, 0, 10))  # taken alone; holds the only build thread
        wait_until(lambda: 0 in builder.started, 5, "the first split's build", interval=0.005)
        for split in (make_split(P0, 10, 20), make_split(P1, 0, 30), make_split(P1, 30, 40)):
            pipeline.submit(split)
        gate.set()
        outcomes = drain(pipeline, 4)
    finally:
        pipeline.close(timeout=5)
    assert all(isinstance(o, Published) for o in outcomes)
    assert builder.batches == [[0], [10, 0, 30], [30]]
    assert store.next_offsets == {P0: 20, P1: 40}


def test_a_batch_that_failed_as_a_whole_is_retried_one_split_per_job(store: FakeStore, builder: FakeBuilder) -> None:
    """One split's failure fails its batch's one job: the retries build each split alone, so a
    split whose offsets are gone does not fail the others again."""
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    store.next_offsets[P1] = 100
    builder.batch_failures[0] = 2  # P0's split fails its batch twice: first with P1's, then alone
    pipeline = Pipeline(
        builder,
        publisher,
        SpecHolder(SPEC, 1),
        build_threads=1,
        build_attempts=3,
        build_retry=BUILD_RETRY.on(FakeClock()),
        batch_linger_s=0.2,
    )
    try:
        pipeline.submit(make_split(P0, 0, 10))
        pipeline.submit(make_split(P1, 100, 110))
        outcomes = {o.split.tp: o for o in drain(pipeline, 2)}
    finally:
        pipeline.close(timeout=5)
    assert all(isinstance(o, Published) for o in outcomes.values())
    assert builder.batches == [[0, 100], [0], [100], [0]]
    assert store.next_offsets == {P0: 10, P1: 110}


def test_splits_submitted_together_share_a_batch_and_one_after_a_quiet_gap_does_not(
    store: FakeStore, builder: FakeBuilder
) -> None:
    """The cuts of one pass come a moment apart: one batch, built without waiting out the linger
    (30 s here: drain's 5 s would run out); a split after a quiet gap is a batch of its own."""
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    pipeline = Pipeline(builder, publisher, SpecHolder(SPEC, 1), build_threads=2, batch_linger_s=30.0)
    try:
        pipeline.submit(make_split(P0, 0, 10))
        pipeline.submit(make_split(P1, 0, 10))
        drain(pipeline, 2, timeout=5)
        pipeline.submit(make_split(P0, 10, 20))
        time.sleep(BATCH_QUIET_S * 5)
        pipeline.submit(make_split(P1, 10, 20))
        drain(pipeline, 2, timeout=5)
    finally:
        pipeline.close(timeout=5)
    assert builder.batches == [[0, 0], [10], [10]]


def test_a_split_whose_offsets_hold_no_record_is_published_in_its_place(store: FakeStore) -> None:
    """Offsets 10 and 11 carry no record (a transaction's markers): the split that covers them
    reads nothing, and must wait for the split before it, then advance the stored offset to the
    log end."""
    from tests.memory_kafka import MemoryBroker

    broker = MemoryBroker()
    broker.produce(P0, *(b"{}" for _ in range(10)))
    broker.begin_transaction(P0, b"{}")
    broker.end_transaction(P0, commit=False)  # 10: an aborted record, 11: its marker
    builder = FakeBuilder(broker=broker).register_with(store)
    gate = threading.Event()
    builder.gates[0] = gate
    publisher = Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02))
    pipeline = Pipeline(builder, publisher, SpecHolder(SPEC, 1), build_threads=2, batch_linger_s=0.0)
    try:
        records, markers = make_split(P0, 0, 10), make_split(P0, 10, 12)
        pipeline.submit(records)
        pipeline.submit(markers)
        wait_until(lambda: 0 in builder.started, 5, "the first split's build", interval=0.005)
        gate.set()
        outcomes = drain(pipeline, 2)
    finally:
        pipeline.close(timeout=5)
    # Published before the split ahead of it, the empty one would have been refused (offset).
    assert [type(o) for o in outcomes] == [Published, Published]
    assert [o.split.id for o in outcomes] == [records.id, markers.id]
    assert list(store.segments) == [records.id, markers.id]  # the empty split did not jump the queue
    assert store.next_offsets[P0] == 12
    published = store.segments[markers.id].segment
    assert (published.files, published.row_count) == ((), 0)
