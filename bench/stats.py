"""Percentiles of small samples (linear interpolation between closest ranks, as numpy's default),
the median of repeated runs, and the throughput row of a peer that writes files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median records/s (the lower one of an even count), annotated with every
    run's records/s. A run that could not be measured ("n/a") makes the whole result n/a."""
    failed = [r for r in runs if r.get("status") == "n/a"]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: float(r["records_per_s"]))
    median = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        median["runs_records_per_s"] = [r["records_per_s"] for r in runs]
    return median


def file_sink_row(result: dict[str, Any], records: int, value_bytes: int) -> dict[str, Any]:
    """The throughput figures of a peer process that writes files (the raw baseline, Quix Streams),
    from the result it wrote: its span is its first record to its last write, its CPU and RSS its
    own."""
    wall = max(result["last_write_at"] - result["first_record_at"], 1e-6)
    return {
        "records": records,
        "rows_written": result["rows"],
        "value_bytes": value_bytes,
        "wall_s": wall,
        "records_per_s": records / wall,
        "mb_per_s": value_bytes / wall / 1e6,
        "cpu_s": result["cpu_s"],
        "cpu_s_per_million": result["cpu_s"] / records * 1e6,
        "peak_rss_mb": result["peak_rss_mb"],
        "files": result["files"],
        "file_bytes": result["file_bytes"],
    }
