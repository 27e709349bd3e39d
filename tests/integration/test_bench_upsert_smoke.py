"""``python -m bench.upsert --quick`` runs end to end on the session's PostgreSQL and Kafka.

A smoke test only: every figure is there, the table holds each key's last record, and the
production audit passed. How fast anything was is not asserted (CI machines are shared and small).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_run import run_bench

# Two Spark JVMs one after the other (the worker's, then the committer's) take most of it. The
# bound is a hang guard.
RUN_TIMEOUT_S = 420

pytestmark = [pytest.mark.process, pytest.mark.timeout(RUN_TIMEOUT_S + 60)]


def test_bench_upsert_quick_merges_the_last_state_per_key_and_audits(
    tmp_path: Path, database_url: str, kafka_bootstrap: str
) -> None:
    out = tmp_path / "out"
    args = ["bench.upsert", "--quick", "--out", str(out), "--database-url", database_url]
    stdout = run_bench([*args, "--bootstrap", kafka_bootstrap], RUN_TIMEOUT_S, grace_s=60)

    result = json.loads((out / "upsert.json").read_text())
    assert result["records"] == result["config"]["records"] == 20_000
    assert result["keys"] == result["table_rows"] == 20_000
    assert result["last_state_ok"], result
    commit = result["commit"]
    # Two segments per partition, merged one per partition at a time.
    assert commit["merges"] == 2 and len(commit["merge_seconds"]) == 2, commit
    for field in ("wall_s", "cpu_s", "changes_per_s", "cpu_s_per_million_changes"):
        assert commit[field] > 0, (field, commit)
    assert result["audit"]["ok"] and result["audit"]["findings"] == 0, result["audit"]
    assert "last state per key ok" in stdout
