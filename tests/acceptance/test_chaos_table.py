"""The CI chaos variant with the Iceberg table on (``python -m tests.chaos --quick --table``):
committers beside the workers through every fault and a SIGKILLed committer; the table holds
every published record exactly once."""

from __future__ import annotations

from pathlib import Path

from tests.chaos import ChaosConfig, run


def test_quick_chaos_run_with_the_table_on_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    config = ChaosConfig.quick(seed=7, workdir=tmp_path, table=True)
    result = run(config, log=print)
    print(result.summary())
    assert {fault.kind for fault in result.faults} == set(config.faults)
    assert "table_kill" in config.faults
    assert result.table_errors == [], result.summary()
    assert result.table_rows == result.produced
    assert result.ok, result.summary()
