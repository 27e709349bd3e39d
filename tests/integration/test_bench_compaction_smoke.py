"""``python -m bench.compaction --quick`` runs end to end on the session's PostgreSQL and Kafka.

A smoke test only: every figure is there, the compaction left fewer files than the worker
made, and the production audit and the exactly-once check passed over the compacted segments.
How fast anything was is not asserted (CI machines are shared and small).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_run import run_bench

# Two Spark JVMs started one after the other (the worker's, then the compaction's) take most of
# it: 3 min measured at a load average of 20-26 on 2 cores. The bound is a hang guard.
RUN_TIMEOUT_S = 420

pytestmark = [pytest.mark.process, pytest.mark.timeout(RUN_TIMEOUT_S + 60)]


def test_bench_compaction_quick_measures_fewer_files_and_audits(
    tmp_path: Path, database_url: str, kafka_bootstrap: str
) -> None:
    out = tmp_path / "out"
    args = ["bench.compaction", "--quick", "--out", str(out), "--database-url", database_url]
    stdout = run_bench([*args, "--bootstrap", kafka_bootstrap], RUN_TIMEOUT_S, grace_s=60)

    result = json.loads((out / "compaction.json").read_text())
    before, after, compaction = result["before"], result["after"], result["compaction"]
    assert result["records"] == result["config"]["records"] == 60_000
    for shape in (before, after):
        assert shape["rows"] == result["records"], shape
        assert shape["bytes"] > 0 and shape["segments"] > 0, shape
        assert 0 < shape["file_bytes_p10"] <= shape["file_bytes_p50"] <= shape["file_bytes_p90"], shape
    # The small segments a fresh stream leaves, then one segment and one file per partition.
    assert before["segments"] >= 2 * result["config"]["partitions"], before
    assert after["files"] < before["files"], (before, after)
    assert after["segments"] == after["files"] == result["config"]["partitions"], after
    assert after["file_bytes_p50"] > before["file_bytes_p50"], (before, after)
    assert compaction["segments_replaced"] == before["segments"] and compaction["refused"] == 0, compaction
    # Two partitions, two runs: the second one's cost is measured without the Spark session's start.
    assert compaction["runs"] == 2, compaction
    for field in (
        "wall_s",
        "cpu_s",
        "gb_read",
        "cpu_s_per_gb",
        "cpu_s_after_first_run",
        "cpu_s_per_gb_after_first_run",
    ):
        assert compaction[field] > 0, (field, compaction)
    # The compact process's Spark JVM is in its figures: more than a Python process alone spends.
    assert compaction["cpu_s_process_tree"] > 2, compaction

    assert result["audit"]["ok"] and result["audit"]["exit_code"] == 0, result["audit"]
    assert result["audit"]["findings"] == 0, result["audit"]
    assert result["exactly_once"]["ok"], result["exactly_once"]
    assert "CPU s per GB" in stdout and "ingest audit --files: passed" in stdout
