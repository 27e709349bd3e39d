"""Spark as a reader of the Iceberg tables (tests and checks; nothing in the product uses it).

Maven Central has no Iceberg Spark runtime for Spark 4.3 (the product's pinned pyspark): the
newest, ``iceberg-spark-runtime-4.1_2.13`` (scripts/iceberg-spark-jars/pom.xml), is built for
Spark 4.1. So the reader runs under its own virtualenv with the pyspark of that line
(``SPARK_VERSION``), made by :func:`setup_venv` (``python -m ingest_dev.iceberg_spark setup``,
which scripts/setup.sh runs; idempotent), and ``iceberg_spark_reader.py`` is started there as a
plain script. It reaches the tables through Iceberg's JdbcCatalog on the metastore's PostgreSQL,
catalog ``ingest``: ``ingest.ingest.<source>`` and ``ingest.ingest_rejects.<source>``.

    python -m ingest_dev.iceberg_spark setup
    python -m ingest_dev.iceberg_spark read [--database-url URL] [--coordinates] SOURCE [--rejects]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from ingest.build.spark_jars import maven_cache
from ingest.table.catalog import CATALOG_NAME, NAMESPACES
from ingest_dev.maven import maven_fetch
from metastore.tables import TableKind

# The Spark line iceberg-spark-runtime-4.1_2.13 is built for (scripts/iceberg-spark-jars/pom.xml):
# keep the two in step.
SPARK_VERSION = "4.1.4"
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ingest-bench" / "iceberg-reader-venv"
PYTHON_ENV = "INGEST_ICEBERG_SPARK_PYTHON"
SCRIPT = Path(__file__).resolve().parent / "iceberg_spark_reader.py"
JARS_POM = Path(__file__).resolve().parent.parent / "scripts" / "iceberg-spark-jars" / "pom.xml"
PASSWORD_ENV = "INGEST_ICEBERG_JDBC_PASSWORD"


class SparkReadFailed(RuntimeError):
    """The Spark reader exited without a result (its error lines are in the message)."""


def _has_runtime(libs: Path) -> bool:
    return libs.is_dir() and any(libs.glob("iceberg-spark-runtime-*.jar")) and any(libs.glob("postgresql-*.jar"))


def fetch_jars(timeout: float = 600.0) -> list[Path]:
    """Iceberg's Spark runtime and PostgreSQL's JDBC driver, fetched from Maven Central once
    (cache keyed by the pom)."""
    libs = maven_fetch(
        JARS_POM, maven_cache(JARS_POM, "iceberg-spark-jars"), "Iceberg's Spark runtime", _has_runtime, timeout
    )
    return sorted(libs.glob("*.jar"))


def _pyspark_version(python: str) -> str | None:
    try:
        proc = subprocess.run(
            [python, "-c", "import pyspark; print(pyspark.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=_clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _clean_env() -> dict[str, str]:
    # Not the project's environment: the venv's own pyspark, no PYTHONPATH into the repo.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "PYSPARK_PYTHON")}


def venv_python() -> str:
    return os.environ.get(PYTHON_ENV) or str(DEFAULT_VENV / "bin" / "python")


def setup_venv(venv: Path = DEFAULT_VENV) -> str:
    """Create the reader's virtualenv with the pinned pyspark (only when it has another or none)
    and fetch the jars; returns its Python."""
    python = venv / "bin" / "python"
    if _pyspark_version(str(python)) != SPARK_VERSION:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=_clean_env())
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"pyspark=={SPARK_VERSION}"],
            check=True,
            timeout=1800,
            env=_clean_env(),  # the checkout on PYTHONPATH would show pip the project's own metadata
        )
    fetch_jars()
    return str(python)


def jdbc_settings(database_url: str) -> tuple[str, str, str | None]:
    """The metastore's URL or DSN (any form psycopg takes) as PgJDBC's URL, user and password."""
    params = conninfo_to_dict(database_url)
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    if "," in host or host.startswith("/"):
        raise ValueError(f"the Spark reader needs one TCP host in the database URL, not {host!r}")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    user = str(params.get("user") or os.environ.get("PGUSER") or os.environ.get("USER") or "postgres")
    dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or user)
    password = params.get("password") or os.environ.get("PGPASSWORD")
    url = f"jdbc:postgresql://{f'[{host}]' if ':' in host else host}:{port}/{dbname}"
    if params.get("sslmode"):
        url += f"?sslmode={params['sslmode']}"
    return url, user, None if password is None else str(password)


def spark_table(source: str, kind: TableKind = TableKind.DATA) -> str:
    """The table's name in Spark: catalog ``ingest``, the pyiceberg namespace, the source."""
    return f"{CATALOG_NAME}.{NAMESPACES[kind]}.{source}"


def read_tables(
    database_url: str, tables: list[str], coordinates: bool = False, python: str | None = None, timeout: float = 600.0
) -> dict[str, Any]:
    """Read the tables with Spark in a subprocess; returns the reader's JSON (see
    iceberg_spark_reader.py). Raises :class:`SparkReadFailed` with its error lines."""
    python = python or venv_python()
    if not Path(python).exists():
        raise SparkReadFailed(f"no Spark reader virtualenv at {python}: run `python -m ingest_dev.iceberg_spark setup`")
    jdbc_url, user, password = jdbc_settings(database_url)
    jars = fetch_jars()
    cmd = [python, str(SCRIPT), "--jdbc-url", jdbc_url, "--user", user, "--jars", ",".join(str(j) for j in jars)]
    if coordinates:
        cmd.append("--coordinates")
    env = _clean_env()
    env.pop(PASSWORD_ENV, None)
    if password:
        env[PASSWORD_ENV] = password
    proc = subprocess.run([*cmd, *tables], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        errors = [line for line in proc.stderr.splitlines() if "Exception" in line or "Error" in line]
        raise SparkReadFailed(
            f"the Spark reader exited {proc.returncode}: "
            + ("\n".join(errors[:20]) if errors else proc.stderr[-4000:] or proc.stdout[-4000:])
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest_dev.iceberg_spark")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="create the reader's virtualenv and fetch its jars (idempotent)")
    read = commands.add_parser("read", help="read a source's table with Spark; prints JSON")
    read.add_argument("--database-url", default=os.environ.get("INGEST_DATABASE_URL"))
    read.add_argument("--rejects", action="store_true", help="the rejects table")
    read.add_argument("--coordinates", action="store_true")
    read.add_argument("source")
    args = parser.parse_args(argv)
    if args.command == "setup":
        python = setup_venv()
        jars = fetch_jars()
        print(f"Iceberg's Spark reader: pyspark {SPARK_VERSION} in {python}; {', '.join(j.name for j in jars)}")
        return 0
    if not args.database_url:
        parser.error("--database-url or INGEST_DATABASE_URL is required")
    table = spark_table(args.source, TableKind.REJECTS if args.rejects else TableKind.DATA)
    print(json.dumps(read_tables(args.database_url, [table], coordinates=args.coordinates), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
