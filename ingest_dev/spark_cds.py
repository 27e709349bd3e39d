"""A class-data-sharing archive of the Spark driver JVM, for the test suite's Spark JVMs.

Most of a fresh Spark driver's start is class loading: on this 2-core machine a local session
and its first job took 8.6-9.0 s without an archive and 3.8-4.0 s with one (C1 only in both,
as the tests run). The suite starts dozens of them (every worker process, every Connect server,
every compactor), so ``scripts/test`` builds the archive once per machine and adds
:func:`java_options` to ``SPARK_SUBMIT_OPTS``. The benchmarks and the product never use it.

The archive is recorded by a training run of the worker's own build (:func:`train`: a session
and the builder's warm-up, parse and Parquet write included) under
``-XX:ArchiveClassesAtExit``, written under a temporary name and renamed. It belongs to one
JDK and one set of Spark jars (its file name carries both). A JVM started with a class path
the archive does not match (a Connect server's, an S3 store's jars) or on another JDK refuses
it and loads its classes as usual: never fatal, and with the ``cds`` logging off, silent, so no
line lands in a worker's output that tests read.

    python -m ingest_dev.spark_cds --java-options   # build the archive if missing; print the options
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ingest" / "spark-cds"
# A refused archive is reported as a warning on the JVM's stdout (a worker's log): off.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _java() -> Path:
    """The java pyspark launches: JAVA_HOME's, else the one on PATH (as spark-class chooses)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home) / "bin" / "java"
    return Path(os.path.realpath(shutil.which("java") or "java"))


def archive_path() -> Path:
    """Where the archive of this JDK and these Spark jars lives."""
    import pyspark

    java = _java()
    version = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False).stderr
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    key = hashlib.sha256("\n".join([str(java), version, pyspark.__version__, *jars]).encode()).hexdigest()[:16]
    return CACHE / f"spark-driver-{key}.jsa"


def train() -> None:
    """The workload the archive records: a local session and a build's parse and write (of
    records made in memory: the class path it records has no Kafka source)."""
    import json
    from datetime import UTC, datetime

    from pyspark.sql import Observation

    from ingest.builder.plan import READ_DDL, make_plan
    from ingest.spark.start import create_session
    from ingest.spec.parse import spec_from_dict

    with tempfile.TemporaryDirectory(prefix="ingest-cds-") as work:
        spec = spec_from_dict(
            {
                "name": "cds",
                "topics": ["cds"],
                "event_time": "ts",
                "segment_store": f"file://{work}/store",
                "schema": {"id": "long", "user": "string", "ts": "timestamp", "tags": "array<string>"},
            }
        )
        spark = create_session("local[1]")
        try:
            at = datetime(2026, 11, 23, tzinfo=UTC)
            rows = [
                # READ_DDL's columns: the Kafka coordinates, key, value, then the row's split index.
                (
                    "cds",
                    i % 2,
                    i,
                    at,
                    b"k",
                    json.dumps({"id": i, "user": "u", "ts": "2026-11-23T10:00:00Z"}).encode(),
                    0,
                )
                for i in range(200)
            ]
            plan = make_plan(spec)
            for good in (True, False):
                df = spark.createDataFrame(rows, READ_DDL).select(*plan.read_columns).withColumn("_error", plan.error)
                df = df.observe(Observation("cds"), plan.total).filter(plan.good if good else ~plan.good)
                df.select(*plan.output_columns).write.option("compression", "zstd").parquet(f"{work}/out-{good}")
        finally:
            spark.stop()


def build(timeout: float = 300.0) -> Path | None:
    """The archive, recorded now when missing. None when it could not be (the suite then runs
    without one: slower, not different)."""
    archive = archive_path()
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    staging = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    base = os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{base} -XX:ArchiveClassesAtExit={staging} {' '.join(QUIET)}"}
    try:
        subprocess.run(
            [sys.executable, "-m", "ingest_dev.spark_cds", "--train"],
            env=env,
            capture_output=True,
            timeout=timeout,
            check=True,
        )
        if not staging.is_file():
            return None
        staging.rename(archive)
        return archive
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"spark_cds: no class-data archive ({type(exc).__name__}): Spark JVMs start without one", file=sys.stderr)
        return None
    finally:
        staging.unlink(missing_ok=True)


def java_options(archive: Path) -> str:
    return " ".join((f"-XX:SharedArchiveFile={archive}", *QUIET))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest_dev.spark_cds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--java-options", action="store_true", help="build if missing, then print the JVM options")
    args = parser.parse_args(argv)
    if args.train:
        train()
        return 0
    archive = build()
    if args.java_options and archive is not None:
        print(java_options(archive))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
