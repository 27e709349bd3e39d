"""``python -m bench --quick`` runs end to end and writes its outputs.

A smoke test only: it checks that every phase produced numbers and files, never how fast
anything was (CI machines are shared and small).  The Quix peer column may be "n/a" when
quixstreams is not installed (it lives in its own virtualenv, see bench/peers/quix.py); the Spark
Structured Streaming peer must run (on the project's own pyspark, with Spark's Kafka source from
the jar set scripts/setup.sh fetches and the bench fetches on first use, see bench/peers/spark.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_run import run_bench

# --quick took ~2.5 min on an idle 2-core machine and ~3.5 min while other tests loaded it with
# 4 Spark JVMs started one after another; the Spark Structured Streaming peer adds two more
# (~1.5 min at load average 7); --freshness starts four more systems at once (two JVMs) in place
# of the Spark peer's latency phase; --fleet adds two fleets of two workers (~1 min, with a Spark
# Connect server).  The bound is a hang guard, not a speed check.
RUN_TIMEOUT_S = 720

pytestmark = [pytest.mark.process, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


def test_bench_quick_writes_results_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # One worker in the throughput phase: N workers with local Spark are the fleet phase's
    # (--fleet: bench.fleet's two fleets, as python -m bench.fleet --quick runs them), and the CI
    # budget has no room for the same fleet twice.
    stdout = run_bench(
        ["bench", "--quick", "--workers", "1", "--freshness", "--fleet", "--out", str(out)], RUN_TIMEOUT_S
    )

    results = json.loads((out / "results.json").read_text())
    assert {"config", "throughput", "ratios", "latency", "exactly_once"} <= set(results)
    throughput = results["throughput"]
    assert "ingest_n" not in throughput
    for key in ("ingest_1", "raw"):
        row = throughput[key]
        assert row["records"] == results["config"]["records"]
        for field in ("records_per_s", "mb_per_s", "cpu_s_per_million", "peak_rss_mb", "wall_s"):
            assert row[field] > 0, (key, field, row[field])
    peer = throughput["peer"]
    assert peer.get("status") == "n/a" or peer["records_per_s"] > 0, peer
    assert results["ratios"]["ingest_1/raw"] > 0

    # The Spark Structured Streaming peer: every produced record committed exactly once through
    # its checkpoint and _spark_metadata, in both the availableNow and the processing-time run.
    spark = throughput["spark"]
    assert spark.get("status") != "n/a", spark
    assert spark["rows_written"] == spark["records"] == results["config"]["records"], spark
    for field in ("records_per_s", "cpu_s_per_million", "peak_rss_mb", "wall_s"):
        assert spark[field] > 0, ("spark", field, spark[field])
    assert results["ratios"]["ingest_1/spark"] > 0
    assert results["exactly_once"]["spark"]["ok"], results["exactly_once"]
    # Equal freshness (--freshness replaces the Spark peer's own produce-to-visible phase): every
    # system probed once at the quick rate, each judged per record against the bound; the two
    # exactly-once systems checked over everything their topics got.
    fresh = results["freshness"]
    assert fresh["config"]["order"] == ["raw", "quix", "spark", "ingest"]
    for key in ("raw", "spark", "ingest"):
        row = fresh["systems"][key]
        assert row.get("status") != "n/a", (key, row)
        [probe] = row["probes"]
        assert probe["rate_asked"] == fresh["config"]["start_rate"] and probe["produced"] > 0, (key, probe)
        assert probe["seen"] >= probe["produced"] and probe["drained"], (key, probe)
        assert probe["outcome"] in ("passed", "failed") and probe["p99_s"] > 0, (key, probe)
        assert row["rate"] in (None, probe["rate_asked"]), (key, row)
    assert fresh["systems"]["quix"].get("status") == "n/a" or fresh["systems"]["quix"]["probes"], fresh
    assert results["exactly_once"]["freshness_spark"]["ok"] and results["exactly_once"]["freshness_ingest"]["ok"]
    assert set(fresh["ratios"]) == {"ingest/raw", "ingest/quix", "ingest/spark"}
    assert "equal freshness" in stdout
    # Cold start of the one-worker run.
    one = throughput["ingest_1"]
    assert one["first_segment_after_start_s"] > 0
    assert one["first_million_records"] == results["config"]["records"]
    assert one["first_million_records_per_s"] > 0

    latency = results["latency"]
    assert latency["publish_transaction_ms"]["n"] > 0
    assert latency["publish_transaction_ms"]["p50"] > 0
    assert latency["produce_to_visible_s"]["n"] > 0
    assert latency["produce_to_visible_s"]["p99"] >= latency["produce_to_visible_s"]["p50"] > 0
    # One worker (the peer's deployment) on its own steady records.
    assert latency["steady"]["workers"] == 1 and "steady_n" not in latency

    assert all(check["ok"] for check in results["exactly_once"].values()), results["exactly_once"]

    # The fleet phase: N workers with local Spark, then N thin workers on one Spark Connect
    # server whose executors run on a standalone cluster, each over its own copy of the data
    # set, exactly once.
    fleets = results["fleet"]
    assert set(fleets) == {"local", "thin-cluster"}
    for mode, row in fleets.items():
        assert row["workers"] == 2 and results["exactly_once"][f"fleet_{mode}"]["ok"], (mode, row)
        assert row["records_per_s"] > 0 and row["cpu_s_per_million"] > 0 and row["peak_rss_mb"] > 0, (mode, row)
        assert row["produce_to_visible_s"]["n"] > 0, (mode, row)
        # Spark reads the records: the workers' own Kafka clients (librdkafka's statistics)
        # received almost none of the data set's bytes (a position's validation receives about
        # a record batch; a fetch decided before a pause, one at most: ingest.config.NO_PREFETCH).
        assert row["value_bytes"] > 0, (mode, row)
        assert row["worker_kafka_received_bytes"] < 0.01 * row["value_bytes"], (mode, row)
    # Thin workers start no JVM; the server's and the cluster's CPU and memory are in the
    # fleet's figures.
    assert fleets["thin-cluster"]["worker_jvms"] == 0, fleets["thin-cluster"]
    assert fleets["thin-cluster"]["server_peak_rss_mb"] > 0
    assert fleets["local"]["worker_jvms"] == fleets["local"]["workers"], fleets["local"]
    assert "thin workers, Connect on the cluster" in stdout

    assert (out / "chart.png").stat().st_size > 0
    assert "records/s" in stdout
    assert "peer: spark structured streaming" in stdout
