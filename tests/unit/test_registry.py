"""The registry: heartbeats and control reads in the background, applied on the polling thread."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from ingest.consume.background import Background
from ingest.consume.heartbeats import WorkerRegistry
from ingest_common.model import DesiredState, LastAudit, WorkerState
from ingest_dev.testkit import wait_until
from tests.fake_metastore import MemoryMetastore
from tests.loop_harness import context


@pytest.fixture
def parts() -> Iterator[tuple[MemoryMetastore, Background, WorkerRegistry]]:
    store = MemoryMetastore()
    background = Background("test-registry")
    yield store, background, WorkerRegistry(context(store, background), interval_s=60.0)
    store.released.set()
    background.close()


def registry_errors(registry: WorkerRegistry) -> float:
    return float(registry._ctx.metrics.metastore_errors.labels("src")._value.get())


def until(done: Callable[[], bool], background: Background) -> None:
    """Apply finished background calls (as the polling thread does) until ``done()``."""
    wait_until(lambda: done() or background.apply_done(), 5, "the background calls", interval=0.002)


def finished(background: Background) -> threading.Event:
    """Set once every call submitted so far has run (one call at a time, in order); their
    results are not applied."""
    marker = threading.Event()
    background.submit(marker.set)
    return marker


def test_controls_change_only_when_the_polling_thread_applies_the_result(
    parts: tuple[MemoryMetastore, Background, WorkerRegistry],
) -> None:
    store, background, registry = parts
    store.set_control("src", DesiredState.SUSPENDED)
    registry.beat(WorkerState.RUNNING, ["t[0]"], force=True)
    assert finished(background).wait(5)
    assert store.heartbeats == [("w1", "running", ("t[0]",))]
    assert registry.desired_state is DesiredState.RUNNING  # read, not applied yet
    background.apply_done()
    assert registry.control is not None and registry.control.desired_state is DesiredState.SUSPENDED
    assert store.heartbeats == [("w1", "running", ("t[0]",))]


def test_one_heartbeat_at_a_time_and_a_hung_metastore_never_blocks_the_caller(
    parts: tuple[MemoryMetastore, Background, WorkerRegistry],
) -> None:
    store, background, registry = parts
    store.hang.set()
    store.released.clear()
    started = time.monotonic()
    for _ in range(100):
        registry.beat(WorkerState.RUNNING, [], force=True)
        registry.error("SOME_ERROR", "message")
    assert time.monotonic() - started < 1.0
    store.hang.clear()
    store.released.set()
    until(lambda: registry.control is not None and len(store.errors) == 100, background)
    assert len(store.heartbeats) == 1


def test_a_failed_heartbeat_is_logged_and_the_next_one_goes_out(
    parts: tuple[MemoryMetastore, Background, WorkerRegistry],
) -> None:
    store, background, registry = parts
    store.unavailable_for = 2
    registry.beat(WorkerState.RUNNING, [], force=True)
    registry.error("SOME_ERROR", "message")
    until(lambda: background.pending == 0, background)
    assert registry.control is None and store.heartbeats == [] and store.errors == []
    # Both failures count in ingest_metastore_errors: a metastore that refuses heartbeats is
    # what an operator looks for there.
    assert registry_errors(registry) == 2
    registry.beat(WorkerState.RUNNING, [], force=True)
    until(lambda: registry.control is not None, background)
    assert len(store.heartbeats) == 1


def test_the_last_audit_read_with_the_heartbeat_is_exported() -> None:
    store = MemoryMetastore()
    background = Background("test-registry")
    ctx = context(store, background)
    registry = WorkerRegistry(ctx, interval_s=60.0)
    try:

        def value(name: str) -> float | None:
            return ctx.metrics.registry.get_sample_value(name, {"source": ctx.source})

        assert (value("ingest_audit_findings"), value("ingest_audit_last_run_timestamp_seconds")) == (None, 0)
        at = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
        store.control_state = dataclasses.replace(store.control_state, last_audit=LastAudit(3, at))
        registry.beat(WorkerState.RUNNING, [], force=True)
        until(lambda: registry.control is not None, background)
        assert (value("ingest_audit_findings"), value("ingest_audit_last_run_timestamp_seconds")) == (
            3,
            at.timestamp(),
        )
    finally:
        store.released.set()
        background.close()
