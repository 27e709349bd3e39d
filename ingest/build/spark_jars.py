"""Where Spark's S3 connector jars live (for s3a:// stores): ``$INGEST_SPARK_JARS_DIR`` (the
image sets it: an installed package has no scripts/ folder), else the Maven cache of
``scripts/spark-jars/pom.xml`` in a checkout (filled by scripts/setup.sh)."""

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
    """Where the S3 connector's jars live: ``$INGEST_SPARK_JARS_DIR``, else the Maven cache of
    ``scripts/spark-jars/pom.xml``."""
    explicit = os.environ.get(SPARK_JARS_ENV)
    return Path(explicit) if explicit else maven_cache(SPARK_JARS_POM, "spark-jars")
