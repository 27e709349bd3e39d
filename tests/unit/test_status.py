"""The status computation: per-partition state and the source's state from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ingest.config import Settings
from ingest.errors import ConfigError
from ingest.ops.status import _state, partition_state
from ingest_common.model import DesiredState

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def state(
    lag: int | None,
    published_s_ago: float | None,
    owner_started_s_ago: float | None = None,
    gap: bool = False,
    stuck_after_s: float = 300.0,
    past_log_end: bool = False,
    registry: bool = False,
) -> str:
    return partition_state(
        stopped_at_gap=gap,
        past_log_end=past_log_end,
        waiting_for_registry=registry,
        lag=lag,
        now=NOW,
        stuck_after_s=stuck_after_s,
        last_publish_at=None if published_s_ago is None else NOW - timedelta(seconds=published_s_ago),
        owner_started_at=None if owner_started_s_ago is None else NOW - timedelta(seconds=owner_started_s_ago),
    )


def test_lag_without_publish_progress_past_the_threshold_is_stuck() -> None:
    assert state(lag=10, published_s_ago=301) == "STUCK"
    assert state(lag=10, published_s_ago=299) == "OK"
    assert state(lag=10, published_s_ago=61, stuck_after_s=60) == "STUCK"


def test_no_lag_or_an_unknown_lag_is_never_stuck() -> None:
    # Caught up and quiet; or Kafka did not answer: no evidence of a stall.
    assert state(lag=0, published_s_ago=10_000) == "OK"
    assert state(lag=None, published_s_ago=10_000) == "OK"


def test_a_partition_that_never_published_counts_from_its_owner_start() -> None:
    assert state(lag=5, published_s_ago=None, owner_started_s_ago=400) == "STUCK"
    assert state(lag=5, published_s_ago=None, owner_started_s_ago=100) == "OK"
    assert state(lag=5, published_s_ago=None, owner_started_s_ago=None) == "OK"  # no owner: NO_WORKERS says it


def test_a_gap_stop_wins_over_stuck() -> None:
    assert state(lag=5, published_s_ago=10_000, gap=True) == "OFFSET_OUT_OF_RANGE"


def test_a_stored_offset_past_the_log_end_is_out_of_range_not_caught_up() -> None:
    # Its lag reads 0 (the log ends below the stored offset).
    assert state(lag=0, published_s_ago=10, past_log_end=True) == "OFFSET_OUT_OF_RANGE"


def test_a_partition_waiting_for_the_schema_registry_says_so_rather_than_stuck() -> None:
    assert state(lag=5, published_s_ago=10_000, registry=True) == "WAITING_FOR_SCHEMA_REGISTRY"
    assert state(lag=5, published_s_ago=1, registry=True) == "WAITING_FOR_SCHEMA_REGISTRY"
    assert state(lag=5, published_s_ago=10_000, gap=True, registry=True) == "OFFSET_OUT_OF_RANGE"


def _p(state: str) -> dict[str, Any]:
    return {"state": state}


def _w(state: str) -> dict[str, Any]:
    return {"state": state}


def test_source_state_precedence() -> None:
    assert _state([_p("OK"), _p("STUCK")], [_w("running")], True, 10) == ("UNHEALTHY", "STUCK_PARTITIONS")
    assert _state([_p("STUCK")], [_w("unhealthy")], True, 10) == ("UNHEALTHY", "SPLITS_FAILING")
    assert _state([_p("OFFSET_OUT_OF_RANGE"), _p("STUCK")], [_w("unhealthy")], True, 10) == (
        "UNHEALTHY",
        "OFFSET_OUT_OF_RANGE",
    )
    # An outside service stops those partitions, as an unreachable Kafka does: more specific
    # than a stall or failing splits, less than a gap that needs an operator.
    waiting = _p("WAITING_FOR_SCHEMA_REGISTRY")
    assert _state([_p("STUCK"), waiting], [_w("unhealthy")], True, 10) == ("UNHEALTHY", "SCHEMA_REGISTRY_UNAVAILABLE")
    assert _state([_p("OFFSET_OUT_OF_RANGE"), waiting], [_w("running")], True, 10)[1] == "OFFSET_OUT_OF_RANGE"
    assert _state([_p("OK")], [_w("running")], True, 10) == ("RUNNING", "RUNNING")
    assert _state([_p("OK")], [_w("running")], True, 0) == ("IDLE", "CAUGHT_UP")


def test_what_the_operator_asked_for_wins() -> None:
    """A suspended source lags by design: it is SUSPENDED, never UNHEALTHY (STUCK_PARTITIONS),
    whose `ingest health` would exit 1 and page someone."""
    assert _state([_p("STUCK")], [_w("suspended")], True, 10, DesiredState.SUSPENDED) == ("SUSPENDED", "SUSPENDED")
    assert _state([_p("OK")], [], True, 10, DesiredState.SUSPENDED) == ("SUSPENDED", "SUSPENDED")
    assert _state([_p("OFFSET_OUT_OF_RANGE")], [_w("suspended")], True, 10, DesiredState.SUSPENDED) == (
        "SUSPENDED",
        "OFFSET_OUT_OF_RANGE",
    )
    assert _state([_p("STUCK")], [], True, 10, DesiredState.TERMINATED) == ("TERMINATED", "TERMINATED")
    assert _state([_p("STUCK")], [_w("draining")], True, 10, DesiredState.DRAINING) == ("UNHEALTHY", "STUCK_PARTITIONS")


def test_thresholds_come_from_the_environment() -> None:
    base = {"INGEST_DATABASE_URL": "postgresql://x/y", "INGEST_KAFKA_BOOTSTRAP": "k:9092"}
    s = Settings.from_env(base)
    assert (s.unhealthy_after_failed_splits, s.stuck_after_s) == (5, 300.0)
    s = Settings.from_env({**base, "INGEST_UNHEALTHY_AFTER_FAILED_SPLITS": "2", "INGEST_STUCK_AFTER_S": "45"})
    assert (s.unhealthy_after_failed_splits, s.stuck_after_s) == (2, 45.0)
    with pytest.raises(ConfigError, match="INGEST_UNHEALTHY_AFTER_FAILED_SPLITS"):
        Settings.from_env({**base, "INGEST_UNHEALTHY_AFTER_FAILED_SPLITS": "0"})
    with pytest.raises(ConfigError, match="INGEST_STUCK_AFTER_S"):
        Settings.from_env({**base, "INGEST_STUCK_AFTER_S": "-1"})
