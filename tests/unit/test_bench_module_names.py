"""The peers run as scripts from bench/peers/ (``python bench/peers/spark_app.py``), which puts
that directory first on their sys.path: a module there named like a standard library module
would shadow it (``bench/profile.py`` broke pyspark's ``import profile``). Every bench directory
is held to it, so that a script may run from any of them."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_module_shadows_the_standard_library() -> None:
    paths = list(BENCH.rglob("*.py"))
    assert {"quix_app", "spark_app"} <= {p.stem for p in paths if p.parent.name == "peers"}, BENCH
    shadowing = sorted(str(p.relative_to(BENCH)) for p in paths if p.stem in sys.stdlib_module_names)
    assert shadowing == []
