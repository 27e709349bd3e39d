"""Splits waiting for a schema registry that does not answer, against the fake builder and
metastore: the build queue retries them on its Backoff's clock without limit, never fails,
rejects or skips them, keeps each partition's publish order, and publishes each once when
the registry answers again; a kill or a close ends the wait at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from ingest.publish.publisher import Publisher
from ingest.publish.settle import Killed, Outcome, Published
from ingest.spec.holder import SpecHolder
from ingest_common.backoff import Backoff
from ingest_common.model import KillReason, WorkerState
from ingest_dev.testkit import wait_until
from tests.fake_metastore import FakeStore
from tests.fakes import FakeBuilder, FakeClock, make_split
from tests.loop_harness import Harness
from tests.stages import Stages as Pipeline
from tests.unit.test_loop import tiles
from tests.unit.test_pipeline import P0, P1, SPEC, drain

# 1 s, 2 s, 4 s, then 4 s for ever.
RETRY = Backoff(1.0, 4.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> FakeStore:
    return FakeStore(serials={P0: 1, P1: 1}, next_offsets={P0: 0, P1: 0})


@pytest.fixture
def builder(store: FakeStore, clock: FakeClock) -> FakeBuilder:
    return FakeBuilder(clock=clock).register_with(store)


@pytest.fixture
def pipeline(store: FakeStore, builder: FakeBuilder, clock: FakeClock) -> Iterator[Pipeline]:
    p = Pipeline(
        builder,
        Publisher(store, "s", "w1", backoff=Backoff(0.01, 0.02)),
        SpecHolder(SPEC, 1),
        build_threads=2,
        build_attempts=2,
        build_retry=Backoff.fixed(0.0).on(clock),
        registry_retry=RETRY.on(clock),
        batch_linger_s=0.0,
    )
    yield p
    p.close(timeout=5)


def refusals(builder: FakeBuilder, n: int) -> None:
    # Generous: the build threads run on a loaded machine too (returns as soon as it holds).
    wait_until(lambda: len(builder.refused) >= n, 30, f"{n} build(s) refused for the registry", interval=0.002)


def test_a_split_waits_for_the_registry_on_the_backoff_without_limit_then_publishes_once(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore, clock: FakeClock
) -> None:
    builder.registry_down = True
    builder.needs_registry = {(P0, 0)}  # P0's first split holds a schema id never fetched
    pipeline.submit(make_split(P0, 0, 10))
    pipeline.submit(make_split(P0, 10, 20))  # its ids are cached: it builds, then waits its turn
    store.next_offsets[P1] = 100
    pipeline.submit(make_split(P1, 100, 110))
    (other,) = drain(pipeline, 1)
    assert isinstance(other, Published) and other.split.tp == P1  # an unaffected partition goes on
    # Far more retries than build_attempts (2): the clock moves only by each due delay.
    delays = [RETRY.delay(n) for n in range(7)]
    for n, delay in enumerate(delays):
        refusals(builder, n + 1)
        # The refusal is seen before the pipeline put the split back with its due time:
        # the clock moves only once the wait is recorded.
        wait_until(lambda: (w := pipeline.registry_wait) is not None and w.retries == n + 1, 30, "the wait")  # noqa: B023
        wait = pipeline.registry_wait
        assert wait is not None and wait.partitions == (P0,) and wait.retries == n + 1
        assert "did not answer" in wait.error
        clock.advance(delay)
    refusals(builder, len(delays) + 1)
    times = [at for _start, at in builder.refused]
    # Each retry came when it was due, not before: 1, 2, 4, 4, ... seconds apart.
    assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == delays
    assert pipeline.poll() == []  # never failed, never resolved while it waited
    assert store.next_offsets[P0] == 0 and pipeline.inflight_count == 2

    builder.registry_down = False
    clock.advance(RETRY.delay(len(delays)))
    outcomes: list[Outcome] = drain(pipeline, 2)
    assert [(o.split.start, type(o)) for o in outcomes] == [(0, Published), (10, Published)]
    assert store.next_offsets == {P0: 20, P1: 110}
    assert [s for s in store.segments] == [other.split.id, *(o.split.id for o in outcomes)]
    assert pipeline.registry_wait is None


def test_a_revoke_ends_a_registry_wait_at_once_and_close_resolves_one(
    pipeline: Pipeline, builder: FakeBuilder, store: FakeStore, clock: FakeClock
) -> None:
    builder.registry_down = True
    builder.needs_registry = {(P0, 0), (P1, 100)}
    store.next_offsets[P1] = 100
    pipeline.submit(make_split(P0, 0, 10))
    pipeline.submit(make_split(P1, 100, 110))
    refusals(builder, 2)
    assert pipeline.registry_wait is not None and pipeline.registry_wait.partitions == (P0, P1)
    pipeline.kill([P0], KillReason.REVOKE)  # the clock does not move: no retry is due
    (killed,) = drain(pipeline, 1)
    assert isinstance(killed, Killed) and killed.reason == KillReason.REVOKE
    wait = pipeline.registry_wait
    assert wait is not None and wait.partitions == (P1,)
    pipeline.close(timeout=5)
    (closed,) = drain(pipeline, 1)
    assert isinstance(closed, Killed) and closed.split.tp == P1
    assert pipeline.registry_wait is None and store.segments == {}


def test_the_loop_holds_a_partition_waiting_for_the_registry_reports_it_and_resumes_exactly_once() -> None:
    h = Harness()
    try:
        h.builder.registry_down = True
        h.builder.needs_registry = {(P0, 0)}
        h.produce(P0, 25)
        h.produce(P1, 10)
        h.consumer.group_assigns(P0, P1)
        h.step_until(lambda: h.published(P1) == [(0, 10)], what="the unaffected partition's split")
        h.step_until(lambda: len(h.builder.refused) >= 6, timeout_s=10, what="six retries of the waiting split")
        h.step_until(lambda: h.store.workers["w1"]["registry_waiting"] == ["t[0]"], what="a heartbeat with the wait")
        # Nothing more is cut from the waiting partition (its later splits would only queue up).
        assert h.publishes.inflight_partitions() == {P0} and h.publishes.inflight_count == 1
        assert h.metrics.paused_partitions.labels("src")._value.get() == 1
        # Alive, not failing: no failure counted, nothing rewound, nothing published past the wait.
        assert h.loop.state is WorkerState.RUNNING and h.loop.unhealthy_reason is None
        assert h.metrics.split_failures.labels("src", "build")._value.get() == 0
        assert h.published(P0) == [] and h.store.next_offsets[P0] == 0
        assert "waiting" in (h.loop.registry_wait or "") and "t[0]" in (h.loop.registry_wait or "")
        assert "did not answer" in (h.store.workers["w1"]["registry_error"] or "")
        assert [r["kind"] for r in h.store.error_rows] == ["SCHEMA_REGISTRY_UNAVAILABLE"]  # once per wait
        assert h.metrics.schema_registry_up.labels("src")._value.get() == 0
        assert h.metrics.schema_registry_waiting_partitions.labels("src")._value.get() == 1

        h.builder.registry_down = False
        h.step_until(lambda: len(h.published(P0)) >= 2, timeout_s=60, what="the waiting partition to resume")
        assert h.loop.registry_wait is None
        assert h.metrics.schema_registry_up.labels("src")._value.get() == 1
        h.step_until(lambda: h.store.workers["w1"]["registry_waiting"] == [], what="a heartbeat without the wait")
        h.clock.advance(60)  # the rest by age
        h.step_until(lambda: tiles(h.published(P0), 0, 25), what="the rest")
        assert h.loop.drain()
        assert tiles(h.published(P1), 0, 10)
    finally:
        h.close()
