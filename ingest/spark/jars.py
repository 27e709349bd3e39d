"""Where the project's one pinned set of Spark jars lives (``scripts/spark-jars/pom.xml``: the
S3 connector, Spark's Kafka source, spark-avro, Iceberg's runtime, PostgreSQL's JDBC driver, all
for the pinned pyspark's Spark line): ``$INGEST_SPARK_JARS_DIR`` (the image sets it: an installed
package has no scripts/ folder), else the Maven cache of that pom in a checkout (filled by
scripts/setup.sh)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SPARK_JARS_POM = Path(__file__).resolve().parents[2] / "scripts" / "spark-jars" / "pom.xml"
SPARK_JARS_ENV = "INGEST_SPARK_JARS_DIR"


def maven_cache(pom: Path, kind: str) -> Path:
    """A cache directory keyed by the pom that pins the jars (``~/.cache/ingest/<kind>/<pom
    hash>/libs``), so a changed pin never runs stale jars."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    return cache / "ingest" / kind / digest / "libs"


def spark_jars_dir() -> Path:
    """Where the jars live: ``$INGEST_SPARK_JARS_DIR``, else the Maven cache of
    ``scripts/spark-jars/pom.xml``."""
    explicit = os.environ.get(SPARK_JARS_ENV)
    return Path(explicit) if explicit else maven_cache(SPARK_JARS_POM, "spark-jars")


def spark_jars() -> list[Path]:
    """Every jar of the set, sorted; ``FileNotFoundError`` (saying how to fetch them) when none."""
    libs = spark_jars_dir()
    jars = sorted(libs.glob("*.jar")) if libs.is_dir() else []
    if not jars:
        raise FileNotFoundError(
            f"no Spark connector jars in {libs}: run scripts/setup.sh, or set INGEST_SPARK_JARS_DIR"
        )
    return jars
