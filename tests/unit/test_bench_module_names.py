"""The peers run as scripts from bench/ (``python bench/peer_spark.py``), which puts bench/ first
on their sys.path: a bench module named like a standard library module would shadow it there
(``bench/profile.py`` broke pyspark's ``import profile``)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_module_shadows_the_standard_library() -> None:
    names = {p.stem for p in BENCH.glob("*.py")}
    assert names, BENCH
    assert sorted(names & set(sys.stdlib_module_names)) == []
