"""bench.fleet's modes and table: the one-worker reference runs by default (not in --quick),
and the table says how the thin fleet compares with it."""

from __future__ import annotations

from typing import Any

from bench.fleet import parse_args, table


def row(mode: str, workers: int, records_per_s: float, peak_rss_mb: float) -> dict[str, Any]:
    return {
        "mode": mode,
        "workers": workers,
        "records_per_s": records_per_s,
        "cpu_s_per_million": 20.0,
        "worker_process_cpu_s_per_million": 0.2,
        "peak_rss_mb": peak_rss_mb,
        "server_peak_rss_mb": 1000.0 if mode == "connect" else 0.0,
        "worker_jvms": 0 if mode == "connect" else workers,
        "produce_to_visible_s": {"n": 10, "p50": 1.0, "p99": 2.0},
        "worker_rss_mb_at_start": [200.0] * workers,
        "worker_rss_mb_peak": [210.0] * workers,
        "worker_kafka_received_bytes": None if mode == "local" else 0.0,
        "value_bytes": 1_000_000,
    }


def test_the_one_worker_reference_runs_by_default_and_not_in_quick() -> None:
    assert parse_args([]).modes == ["one", "local", "connect", "cluster", "thin-cluster"]
    assert parse_args(["--quick"]).modes == ["local", "thin-cluster"]
    assert parse_args(["--quick", "--modes", "one,connect"]).modes == ["one", "connect"]


def test_the_table_compares_the_thin_fleet_with_one_worker() -> None:
    text = table([row("one", 1, 60_000, 1_500), row("local", 3, 45_000, 3_000), row("connect", 3, 66_000, 2_400)])
    lines = text.splitlines()
    assert lines[1].startswith("one worker with local Spark") and lines[3].startswith("thin workers, one Spark")
    assert lines[-1] == "thin fleet / one worker: 1.10x the records/s, 1.60x the peak RSS; 0.80x the local fleet's RSS"
    assert "thin fleet" not in table([row("local", 3, 45_000, 3_000), row("connect", 3, 66_000, 2_400)])


def test_the_table_shows_what_reached_the_workers_and_compares_the_cluster_fleet() -> None:
    text = table([row("one", 1, 60_000, 1_500), row("local", 2, 45_000, 3_000), row("thin-cluster", 3, 72_000, 2_400)])
    lines = text.splitlines()
    assert "200→210" in lines[1] and "0 of 1,000,000" in lines[1]
    assert "n/a" in lines[2]  # a fleet whose statistics were not scraped says so, never 0
    assert lines[-1] == "thin workers on the cluster / one local worker: 1.20x the records/s"
