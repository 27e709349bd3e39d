"""The jars of the local Kafka broker and of every Spark of the project, and the tests' schema
registry, pinned by poms under scripts/ and fetched once from Maven Central into a cache keyed
by the pom (scripts/setup.sh runs ``python -m ingest_dev.fetch fetch-kafka | fetch-spark-jars |
fetch-schema-registry | fetch-nessie``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from ingest.spark.jars import SPARK_JARS_POM, maven_cache, spark_jars_dir

_SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
KAFKA_POM = _SCRIPTS / "kafka" / "pom.xml"
KAFKA_LIBS_ENV = "INGEST_KAFKA_LIBS"
SCHEMA_REGISTRY_POM = _SCRIPTS / "schema-registry" / "pom.xml"
SCHEMA_REGISTRY_SETTINGS = _SCRIPTS / "schema-registry" / "settings.xml"
SCHEMA_REGISTRY_HOME_ENV = "INGEST_SCHEMA_REGISTRY_HOME"
NESSIE_POM = _SCRIPTS / "nessie" / "pom.xml"


def maven_fetch(
    pom: Path,
    libs: Path,
    what: str,
    complete: Callable[[Path], bool],
    timeout: float,
    settings: Path | None = None,
    unpack: Callable[[Path], None] | None = None,
) -> Path:
    """Copy the dependencies a pom pins from Maven Central into ``libs`` (once), with Maven's
    ``settings`` file if given, then ``unpack`` them in place if given. Maven writes into a
    sibling temporary directory that is renamed into place once complete, so an interrupted
    fetch never leaves a half-filled classpath behind."""
    if complete(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FileNotFoundError(
            f"{what} jars are not fetched and Maven is not installed; "
            "run scripts/setup.sh (Debian packages 'maven' and 'openjdk-17-jre-headless')"
        )
    libs.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=libs.parent))
    options = ["-s", str(settings)] if settings else []
    try:
        result = subprocess.run(
            [mvn, "-q", "-B", *options, "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={staging}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        if result.returncode == 0 and unpack is not None:
            unpack(staging)
        if result.returncode != 0 or not complete(staging):
            raise RuntimeError(
                f"mvn could not fetch {what} (exit {result.returncode}):\n"
                + result.stdout.decode("utf-8", errors="replace")[-4000:]
            )
        staging.rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def kafka_libs_dir() -> Path:
    """Where the broker's jars live: ``$INGEST_KAFKA_LIBS``, else the Maven cache of
    ``scripts/kafka/pom.xml``."""
    explicit = os.environ.get(KAFKA_LIBS_ENV)
    return Path(explicit) if explicit else maven_cache(KAFKA_POM, "kafka")


def fetch_kafka(timeout: float = 600.0) -> Path:
    """The pinned Kafka jars, fetched from Maven Central into :func:`kafka_libs_dir` once."""
    return maven_fetch(KAFKA_POM, kafka_libs_dir(), "Apache Kafka", lambda d: _kafka_jar(d) is not None, timeout)


def _kafka_jar(libs: Path) -> Path | None:
    jars = sorted(libs.glob("kafka_2.13-*.jar")) if libs.is_dir() else []
    return jars[0] if jars else None


# ------------------------------------------------------------ Spark's jars

# One jar of each dependency the pom names (the set is complete when every one is there).
SPARK_JAR_PREFIXES = (
    "hadoop-aws-",
    "spark-hadoop-cloud_2.13-",
    "spark-sql-kafka-0-10_2.13-",
    "spark-avro_2.13-",
    "iceberg-spark-runtime-",
    "postgresql-",
)


def _has_spark_jars(libs: Path) -> bool:
    return libs.is_dir() and all(any(libs.glob(f"{prefix}*.jar")) for prefix in SPARK_JAR_PREFIXES)


def fetch_spark_jars(timeout: float = 600.0) -> list[Path]:
    """The pinned Spark jars (``scripts/spark-jars/pom.xml``): the S3 connector and its
    committer binding, Spark's Kafka source, spark-avro, Iceberg's runtime and PostgreSQL's
    JDBC driver, fetched from Maven Central once; every jar, sorted."""
    libs = maven_fetch(SPARK_JARS_POM, spark_jars_dir(), "Spark's jars", _has_spark_jars, timeout)
    return sorted(libs.glob("*.jar"))


# ------------------------------------------------------------ the schema registry


def schema_registry_home() -> Path:
    """Where Apicurio Registry's unpacked Quarkus application lives (``quarkus-run.jar`` and
    ``lib/``): ``$INGEST_SCHEMA_REGISTRY_HOME``, else the cache of
    ``scripts/schema-registry/pom.xml``."""
    explicit = os.environ.get(SCHEMA_REGISTRY_HOME_ENV)
    return Path(explicit) if explicit else maven_cache(SCHEMA_REGISTRY_POM, "schema-registry").with_name("app")


def _has_quarkus_app(home: Path) -> bool:
    return (home / "quarkus-run.jar").is_file() and (home / "lib" / "main").is_dir()


def _unpack_assemblies(staging: Path) -> None:
    """Unpack each ``*.tar.gz`` Maven copied into ``staging`` there, then drop the archive
    (Maven's local repository keeps a copy)."""
    for archive in staging.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                # Python 3.11.4+: refuses absolute paths, links out of the tree, device files.
                tar.extractall(staging, filter="data")
            else:
                # Python before 3.11.4 (Debian 12's 3.11.2): an archive from Maven Central, pinned by the pom.
                tar.extractall(staging)
        archive.unlink()


def fetch_schema_registry(timeout: float = 900.0) -> Path:
    """Apicurio Registry's application (the ``tar.gz:all`` assembly the pom pins), fetched from
    Maven Central and unpacked into :func:`schema_registry_home` once; Maven uses the
    settings file beside the pom, which keeps it off every other repository."""
    return maven_fetch(
        SCHEMA_REGISTRY_POM,
        schema_registry_home(),
        "Apicurio Registry",
        _has_quarkus_app,
        timeout,
        settings=SCHEMA_REGISTRY_SETTINGS,
        unpack=_unpack_assemblies,
    )


def schema_registry_version(home: Path | None = None) -> str:
    """The fetched registry's version, from its application jar (``apicurio-registry-app-3.3.3.jar``)."""
    app = home or schema_registry_home()
    jars = sorted((app / "app").glob("apicurio-registry-app-*.jar")) if (app / "app").is_dir() else []
    if not jars:
        raise FileNotFoundError(f"no apicurio-registry-app jar in {app / 'app'}; run scripts/setup.sh")
    return jars[0].name.removeprefix("apicurio-registry-app-").removesuffix(".jar")


# ------------------------------------------------------------ the REST catalog (Nessie)


def _nessie_jar(libs: Path, prefix: str = "nessie-quarkus-") -> Path | None:
    jars = sorted(libs.glob(f"{prefix}*.jar")) if libs.is_dir() else []
    return jars[0] if jars else None


def _has_nessie_jars(libs: Path) -> bool:
    return _nessie_jar(libs) is not None and _nessie_jar(libs, "iceberg-aws-bundle-") is not None


def fetch_nessie(timeout: float = 900.0) -> Path:
    """Project Nessie's server (one self-contained Quarkus jar, ``scripts/nessie/pom.xml``) and
    Iceberg's AWS bundle (Spark's S3FileIO for its tables), fetched from Maven Central into the
    pom's cache once, with the settings file that keeps Maven on Maven Central alone; the
    server jar's path."""
    libs = maven_fetch(
        NESSIE_POM,
        maven_cache(NESSIE_POM, "nessie"),
        "Project Nessie",
        _has_nessie_jars,
        timeout,
        SCHEMA_REGISTRY_SETTINGS,
    )
    jar = _nessie_jar(libs)
    assert jar is not None  # maven_fetch checked it
    return jar


def iceberg_aws_bundle() -> Path:
    """Iceberg's AWS bundle jar (fetched with Nessie: :func:`fetch_nessie`)."""
    jar = _nessie_jar(fetch_nessie().parent, "iceberg-aws-bundle-")
    assert jar is not None  # fetch_nessie checked it
    return jar


def nessie_version(jar: Path) -> str:
    """The version of a fetched Nessie server, from its jar's name (``nessie-quarkus-0.99.0-runner.jar``)."""
    return jar.name.removeprefix("nessie-quarkus-").removesuffix("-runner.jar")


def kafka_version(libs: Path | None = None) -> str:
    """The version of the fetched broker, from its jar's name (``kafka_2.13-4.4.0.jar``)."""
    jar = _kafka_jar(libs or kafka_libs_dir())
    if jar is None:
        raise FileNotFoundError(f"no kafka_2.13 jar in {libs or kafka_libs_dir()}; run scripts/setup.sh")
    return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
