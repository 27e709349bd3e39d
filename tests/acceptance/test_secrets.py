"""Secrets (the metastore password, SASL credentials) never reach logs, errors or ``status``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest.embedded import free_port
from metastore import redact_url
from tests.acceptance.harness import REPO, process_env

PASSWORD = "s3cr3t-Pa55"
SASL_PASSWORD = "sasl-h1dden"


@pytest.mark.parametrize("url", [
    f"postgresql://ingest:{PASSWORD}@db.example:5432/ingest",
    f"postgresql://ingest:{PASSWORD}@db.example/ingest?sslmode=require",
    f"host=db.example user=ingest password={PASSWORD} dbname=ingest",
    f"postgresql://db.example/ingest?user=ingest&password={PASSWORD}",
])
def test_redact_url_hides_the_password(url: str) -> None:
    redacted = redact_url(url)
    assert PASSWORD not in redacted and "***" in redacted and "db.example" in redacted


@pytest.mark.parametrize("argv", [["status", "clicks", "--json"], ["worker", "clicks"], ["migrate"]])
def test_commands_that_fail_to_reach_the_metastore_do_not_print_credentials(argv: list[str]) -> None:
    # Nothing listens on this port: every command fails at its first metastore call.
    url = f"postgresql://ingest:{PASSWORD}@127.0.0.1:{free_port()}/ingest?connect_timeout=2"
    env = process_env(url, "127.0.0.1:1", INGEST_KAFKA_PROP_SECURITY_PROTOCOL="SASL_PLAINTEXT",
                      INGEST_KAFKA_PROP_SASL_MECHANISM="PLAIN", INGEST_KAFKA_PROP_SASL_USERNAME="ingest",
                      INGEST_KAFKA_PROP_SASL_PASSWORD=SASL_PASSWORD)
    proc = subprocess.run([sys.executable, "-m", "ingest", *argv], env=env, cwd=Path(REPO), capture_output=True,
                          text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "127.0.0.1" in output, output  # it does say where it failed to connect
    assert PASSWORD not in output and SASL_PASSWORD not in output, output
