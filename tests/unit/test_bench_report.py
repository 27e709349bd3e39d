"""The bench's median-of-runs selection, a file-writing peer's row, and how the table reports them."""

from __future__ import annotations

from typing import Any

from bench.report import table
from bench.stats import file_sink_row, median_run


def run(rps: float) -> dict[str, Any]:
    return {
        "records": 1000,
        "wall_s": 1000 / rps,
        "records_per_s": rps,
        "mb_per_s": 1.0,
        "cpu_s_per_million": 5.0,
        "peak_rss_mb": 100.0,
        "workers": 1,
    }


def test_the_median_run_is_reported_with_every_runs_throughput() -> None:
    runs = [run(300.0), run(100.0), run(200.0)]
    median = median_run(runs)
    assert median["records_per_s"] == 200.0
    assert median["wall_s"] == 5.0
    assert median["runs_records_per_s"] == [300.0, 100.0, 200.0]
    # Even counts take the lower middle run: a median never flatters.
    assert median_run([run(100.0), run(400.0)])["records_per_s"] == 100.0
    assert "runs_records_per_s" not in median_run([run(100.0)])


def test_one_failed_run_makes_the_result_not_available() -> None:
    failed = {"status": "n/a", "reason": "no result within 10 s"}
    assert median_run([run(100.0), failed, run(300.0)]) == failed


def test_a_file_sink_row_spans_its_first_record_to_its_last_write() -> None:
    result = {
        "first_record_at": 100.0,
        "last_write_at": 104.0,
        "rows": 2_000_000,
        "cpu_s": 6.0,
        "peak_rss_mb": 80.0,
        "files": 3,
        "file_bytes": 5000,
    }
    row = file_sink_row(result, 2_000_000, 400_000_000)
    assert (row["wall_s"], row["records_per_s"], row["mb_per_s"]) == (4.0, 500_000.0, 100.0)
    assert (row["cpu_s"], row["cpu_s_per_million"], row["peak_rss_mb"]) == (6.0, 3.0, 80.0)
    assert (row["records"], row["rows_written"], row["files"], row["file_bytes"]) == (2_000_000, 2_000_000, 3, 5000)


def test_the_table_lists_each_runs_throughput() -> None:
    results = {
        "throughput": {"ingest_1": median_run([run(100.0), run(300.0), run(200.0)]), "raw": run(900.0)},
        "ratios": {"ingest_1/raw": 200 / 900},
        "config": {"split": {"max_age": "3s"}},
    }
    text = table(results)
    assert "median of runs; records/s of each run: ingest (1 worker) 100 / 300 / 200" in text
    assert "raw baseline 900" not in text.split("median of runs")[1]
