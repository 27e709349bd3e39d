"""Metric helpers: parse errors by reason and the one-hot worker state."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from ingest.ops.metrics import UNKNOWN_REASON, Metrics
from ingest_common.model import (
    PARSE_ERRORS,
    BuiltSegment,
    ConflictReason,
    FailureStage,
    GapAction,
    KillReason,
    RebalanceKind,
    SparkConnectEvent,
    WorkerState,
)

WORKER_STATES = [s.value for s in WorkerState]

REPO = Path(__file__).resolve().parents[2]


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {"source": "s", **labels})


def segment(**over: object) -> BuiltSegment:
    base: dict[str, object] = {
        "split_id": uuid.uuid4(),
        "location": "file:///x",
        "files": (),
        "row_count": 1,
        "size_bytes": 1,
    }
    base.update(over)
    return BuiltSegment(**base)  # type: ignore[arg-type]


def test_rejects_and_skips_are_counted_by_reason_and_every_reason_exists_from_the_start() -> None:
    m = Metrics("s")
    assert all(sample(m, "ingest_records_rejected_total", reason=r) == 0 for r in PARSE_ERRORS)
    m.count_parse_errors(segment(rejects_count=5, parse_errors=(("invalid_json", 3), ("null_value", 2))))
    m.count_parse_errors(segment(skipped_count=4, parse_errors=(("type_mismatch", 4),)))
    # A builder that gives no reasons: the total still adds up, under "unknown".
    m.count_parse_errors(segment(rejects_count=2))
    assert sample(m, "ingest_records_rejected_total", reason="invalid_json") == 3
    assert sample(m, "ingest_records_rejected_total", reason="null_value") == 2
    assert sample(m, "ingest_records_rejected_total", reason=UNKNOWN_REASON) == 2
    assert sample(m, "ingest_records_rejected_total", reason="type_mismatch") == 0
    assert sample(m, "ingest_records_skipped_total", reason="type_mismatch") == 4


def test_worker_state_is_one_hot() -> None:
    m = Metrics("s")
    assert {s: sample(m, "ingest_worker_state", state=s) for s in WORKER_STATES} == {
        s: float(s == "starting") for s in WORKER_STATES
    }
    m.set_worker_state(WorkerState.DRAINING)
    assert {s: sample(m, "ingest_worker_state", state=s) for s in WORKER_STATES} == {
        s: float(s == "draining") for s in WORKER_STATES
    }
    m.set_worker_state(WorkerState.UNHEALTHY)
    assert {s for s in WORKER_STATES if sample(m, "ingest_worker_state", state=s) == 1} == {"unhealthy"}


def test_every_counter_label_value_exists_at_zero_from_the_start() -> None:
    # increase() reads a series that appears at its first increment as 0: an alert on the first
    # publish conflict (or kill, failure, gap) would never fire unless the series starts at 0.
    m = Metrics("s")
    families = {
        "ingest_publish_conflicts_total": ("reason", ConflictReason),
        "ingest_splits_killed_total": ("reason", KillReason),
        "ingest_split_failures_total": ("stage", FailureStage),
        "ingest_rebalances_total": ("kind", RebalanceKind),
        "ingest_offset_gap_records_total": ("action", GapAction),
        "ingest_spark_connect_events_total": ("event", SparkConnectEvent),
    }
    for name, (label, values) in families.items():
        assert {v.value: sample(m, name, **{label: v.value}) for v in values} == dict.fromkeys(
            (v.value for v in values), 0.0
        ), name


def test_conflict_reasons_are_the_ones_the_metastore_records() -> None:
    sql = (REPO / "migrations" / "0008_split_registry.sql").read_text()
    check = re.search(r"CHECK \(reason IN \(([^)]*)\)\)", sql)
    assert check is not None
    assert {v.strip(" '") for v in check.group(1).split(",")} == {r.value for r in ConflictReason}
