"""Produce-to-visible per record and the equal-freshness table (no servers)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.freshness.report import ratios, table
from bench.freshness.visibility import Window, nearest_rank, read_timestamps_ms, summary, timestamps_ms


def test_timestamps_of_every_writer_become_epoch_milliseconds(tmp_path: Path) -> None:
    ms = [1_700_000_000_123, 1_700_000_001_000]
    for kind in (pa.timestamp("us", tz="UTC"), pa.timestamp("ms", tz="UTC"), pa.int64()):
        values = [m * 1000 for m in ms] if kind == pa.timestamp("us", tz="UTC") else ms
        path = tmp_path / f"{kind}.parquet".replace(",", "").replace(" ", "")
        pq.write_table(pa.table({"_timestamp": pa.array(values, kind)}), path)
        assert list(read_timestamps_ms("file://" + str(path))) == [float(m) for m in ms], kind
    assert list(timestamps_ms(pa.array([5], pa.timestamp("s")))) == [5000.0]


def test_only_the_windows_records_count_and_each_latency_is_its_units_moment() -> None:
    window = Window.of(started_at=100.0, ended_at=101.0, produced=3)
    # One record from before the probe (an earlier probe's, or a duplicate), three of it.
    added = window.add(103.0, np.array([99_000.0, 100_000.0, 100_500.0]))
    added += window.add(104.0, np.array([101_000.0]))
    assert added == 3 and window.seen == 3
    verdict = summary(window, bound_s=3.5)
    assert verdict["passed"] and verdict["missing"] == 0
    assert verdict["p99_s"] == 3.0 and verdict["max_s"] == 3.0 and verdict["p50_s"] == 3.0
    assert sorted(window.latencies()) == [2.5, 3.0, 3.0]


def test_a_record_never_visible_fails_the_probe_however_fast_the_rest() -> None:
    window = Window.of(100.0, 101.0, produced=2)
    window.add(100.2, np.array([100_000.0]))
    verdict = summary(window, bound_s=5)
    assert not verdict["passed"] and verdict["missing"] == 1
    assert verdict["p99_s"] is None and verdict["max_s"] is None
    # Duplicates of an at-least-once system: more seen than produced still passes.
    window = Window.of(100.0, 101.0, produced=1)
    window.add(101.0, np.array([100_000.0, 100_000.0]))
    assert summary(window, bound_s=5)["passed"]


def test_nearest_rank_counts_the_unseen_as_infinitely_late() -> None:
    ordered = list(range(1, 101))
    assert nearest_rank(ordered, 99, 100) == 99
    assert nearest_rank(ordered, 99, 101) == 100
    assert nearest_rank(ordered, 99, 102) == math.inf
    assert math.isnan(nearest_rank([], 99, 0))


def _row(rate: float | None, **extra: Any) -> dict[str, Any]:
    probes = [{"rate_asked": 1000.0, "outcome": "passed"}, {"rate_asked": 2000.0, "outcome": "failed"}]
    return {"rate": rate, "p99_s": 4.2, "cpu_s_per_million": 12.5, "probes": probes, **extra}


def _results(systems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    config = {"bound_s": 5.0, "interval_s": 2.5, "probe_s": 30.0, "factor": 2.0, "start_rate": 5000, "tolerance": 0.1}
    return {"config": config, "systems": systems}


def test_ratios_are_the_workers_rate_over_each_other_systems() -> None:
    results = _results(
        {"ingest": _row(120_000), "raw": _row(150_000), "quix": {"status": "n/a"}, "spark": _row(100_000)}
    )
    assert ratios(results) == {"ingest/raw": 0.8, "ingest/quix": None, "ingest/spark": 1.2}
    assert ratios(_results({"ingest": _row(None), "raw": _row(1.0)}))["ingest/raw"] is None


def test_the_table_has_a_row_per_system_with_ratios_probes_and_why_one_is_missing() -> None:
    results = _results(
        {
            "ingest": _row(120_000),
            "raw": _row(150_000, lower_bound=True),
            "quix": {"status": "n/a", "reason": "quixstreams not installed"},
            "spark": _row(100_000),
        }
    )
    text = table(results)
    lines = text.splitlines()
    assert "p99 <= 5 s" in lines[0] and "interval 2.5 s" in lines[0]
    ingest = next(line for line in lines if line.startswith("ingest"))
    assert "120,000" in ingest and "0.80" in ingest and "1.20" in ingest and "1,000ok 2,000x" in ingest
    assert "≥ 150,000" in next(line for line in lines if line.startswith("raw"))
    assert "Quix Streams (at-least-once): n/a, quixstreams not installed" in text
    assert lines[1].index("records/s") < lines[1].index("/ spark")
