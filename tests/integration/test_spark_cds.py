"""The test suite's Spark class-data archive (ingest_dev.spark_cds, scripts/test): a driver
started with its options maps the archive for most of the classes it loads, and prints nothing
about it. A refused archive (another JDK, other jars) would only make every Spark start in the
suite slower, silently: this is what notices."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ingest_dev import spark_cds
from ingest_dev.process import run_process

SESSION = "from ingest.spark.start import create_session; s = create_session('local[1]'); s.range(3).count(); s.stop()"


def test_a_local_spark_driver_loads_its_classes_from_the_archive(tmp_path: Path) -> None:
    archive = spark_cds.build()
    assert archive is not None and archive.is_file()
    loads = tmp_path / "classes.log"
    options = f"-XX:TieredStopAtLevel=1 {spark_cds.java_options(archive)} -Xlog:class+load=info:file={loads}"
    proc = run_process(
        [sys.executable, "-c", SESSION],
        env={**os.environ, "SPARK_SUBMIT_OPTS": options},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = loads.read_text().splitlines()
    shared = sum(1 for line in lines if "source: shared objects file (top)" in line)
    # ~16,000 classes, ~10,700 of them from the archive when it maps (measured); none when refused.
    assert shared > 0.5 * len(lines), (shared, len(lines))
    assert "cds" not in proc.stdout, proc.stdout[-2000:]
