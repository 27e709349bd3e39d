"""A regular (non-editable) install: the wheel carries the metastore's SQL and the schema
migrations, so ``ingest migrate`` from it creates the schema on an empty database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import venv
import zipfile
from pathlib import Path

import pytest

from ingest_dev.postgres import PostgresServer
from metastore import Metastore

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


def run(*args: object, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_a_wheel_in_a_fresh_virtualenv_migrates_an_empty_database(tmp_path: Path, pg_server: PostgresServer) -> None:
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--wheel-dir",
        tmp_path / "dist",
        REPO,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("ingest-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packages = {name.split("/", 1)[0] for name in archive.namelist() if "/" in name}
    # Development support (local servers, demo, verifier) stays in the checkout.
    assert "ingest_dev" not in packages, sorted(packages)
    assert {"ingest", "ingest_common", "metastore"} <= packages, sorted(packages)
    # The dependencies (pyspark alone is hundreds of MB) come from this interpreter's site
    # packages; the project itself only from the wheel, run from a directory without the checkout.
    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    # --ignore-installed: an editable install of the checkout in the base interpreter's site
    # packages (visible through system_site_packages) would otherwise count as this version.
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed", wheel, cwd=tmp_path)
    # Neither the checkout (PYTHONPATH) nor its settings reach the installed package.
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("INGEST_", "PYTHONPATH"))}
    where = run(
        python,
        "-c",
        # The subpackages (ingest.table, ingest.builder, ...) are found by pyproject's package discovery.
        "import ingest, ingest.table.committer, metastore.migrations as m; print(ingest.__file__); "
        "print(m.MIGRATIONS); print(sum(1 for f in m.MIGRATIONS.iterdir() if f.name.endswith('.sql')))",
        cwd=tmp_path,
        env=clean_env,
    ).split()
    assert all(w.startswith(str(tmp_path / "venv")) for w in where[:2]), where
    expected = len(list((REPO / "migrations").glob("*.sql")))
    assert int(where[2]) == expected
    # Every production module imports without ingest_dev (not installed, the checkout not on the path).
    imported = run(
        python,
        "-c",
        "import importlib, importlib.util, pkgutil, sys\n"
        "assert importlib.util.find_spec('ingest_dev') is None\n"
        "names = [m.name for p in ('ingest', 'ingest_common', 'metastore')"
        " for m in pkgutil.walk_packages(importlib.import_module(p).__path__, p + '.')"
        " if not m.name.endswith('__main__')]\n"
        "[importlib.import_module(n) for n in names]\n"
        "assert not [m for m in sys.modules if m.startswith('ingest_dev')]\n"
        "print(len(names))",
        cwd=tmp_path,
        env=clean_env,
    )
    assert int(imported) > 20, imported

    name = "wheel_" + uuid.uuid4().hex[:8]
    url = pg_server.create_database(name)
    try:
        out = run(python, "-m", "ingest", "migrate", cwd=tmp_path, env={**clean_env, "INGEST_DATABASE_URL": url})
        assert f"applied {expected} migration(s)" in out, out
        with Metastore(url) as store:
            assert store.list_sources() == []
            tables = {
                r["table_name"]
                for r in store._connection()
                .execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
                .fetchall()
            }
        assert {"ingest_sources", "ingest_partitions", "ingest_segments", "ingest_builds", "ingest_splits"} <= tables
        assert {"ingest_tables", "ingest_table_segments", "iceberg_tables", "iceberg_namespace_properties"} <= tables
    finally:
        pg_server.drop_database(name)


def test_production_code_never_names_ingest_dev() -> None:
    """Imports inside functions escape the import check above: no production file names it."""
    offenders = [
        str(path.relative_to(REPO))
        for package in ("ingest", "ingest_common", "metastore")
        for path in (REPO / package).rglob("*.py")
        if "ingest_dev" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []
