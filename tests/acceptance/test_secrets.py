"""Secrets (the metastore password, SASL credentials, a Spark Connect token, credentials in
a stored spec) never reach logs, errors, tracebacks, ``status`` or ``source history``."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from ingest_dev.postgres import PostgresServer
from ingest_dev.process import run_process
from ingest_dev.testkit import free_port
from metastore import Metastore, redact_url
from tests.acceptance.harness import REPO, apply_spec, process_env, write_spec
from tests.fixtures.servers import MakeTopic

PASSWORD = "s3cr3t-Pa55"
# libpq accepts an unencoded '@' in a URL's password (the host follows the last one).
AT_PASSWORD = "s3cr3t-Pa55@h1dden-tail"
SASL_PASSWORD = "sasl-h1dden"
TOKEN = "c0nnect-t0ken"
SECRETS = (PASSWORD, "h1dden-tail", SASL_PASSWORD, TOKEN)


def run_cli(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    proc = run_process(
        [sys.executable, "-m", "ingest", *argv],
        env=env,
        cwd=Path(REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def assert_no_secret(output: str) -> None:
    leaked = [s for s in SECRETS if s in output]
    assert not leaked, f"{leaked} in:\n{output}"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://ingest:{PASSWORD}@db.example:5432/ingest",
        f"postgresql://ingest:{PASSWORD}@db.example/ingest?sslmode=require",
        f"postgresql://ingest:{AT_PASSWORD}@db.example/ingest",
        f"host=db.example user=ingest password={PASSWORD} dbname=ingest",
        f"host=db.example user=ingest password='{AT_PASSWORD} x' dbname=ingest",
        f"postgresql://db.example/ingest?user=ingest&password={PASSWORD}",
    ],
)
def test_redact_url_hides_the_password(url: str) -> None:
    redacted = redact_url(url)
    assert_no_secret(redacted)
    assert "***" in redacted and "db.example" in redacted


def _unreachable_urls() -> list[tuple[str, str]]:
    """(connection string, what the error line must say)"""
    port = free_port()  # nothing listens: every command fails at its first metastore call
    return [
        (f"postgresql://ingest:{PASSWORD}@127.0.0.1:{port}/ingest?connect_timeout=2", "127.0.0.1"),
        # libpq would split at the first '@' and print the rest as a host name it cannot resolve.
        (
            f"postgresql://ingest:{AT_PASSWORD}@127.0.0.1:{port}/ingest?connect_timeout=2",
            "INGEST_DATABASE_URL: an '@' in the user name or password must be written %40",
        ),
        (f"host=127.0.0.1 port={port} user=ingest password={AT_PASSWORD} dbname=ingest connect_timeout=2", "127.0.0.1"),
    ]


@pytest.mark.parametrize(("url", "says"), _unreachable_urls(), ids=["url", "url-with-@", "key=value"])
@pytest.mark.parametrize("argv", [["status", "clicks", "--json"], ["worker", "clicks"], ["migrate"]])
def test_commands_that_fail_to_reach_the_metastore_do_not_print_credentials(
    argv: list[str],
    url: str,
    says: str,
) -> None:
    env = process_env(
        url,
        "127.0.0.1:1",
        INGEST_KAFKA_PROP_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        INGEST_KAFKA_PROP_SASL_MECHANISM="PLAIN",
        INGEST_KAFKA_PROP_SASL_USERNAME="ingest",
        INGEST_KAFKA_PROP_SASL_PASSWORD=SASL_PASSWORD,
    )
    code, output = run_cli(argv, env)
    assert code != 0, output
    assert says in output, output  # it does say where (or why) it failed to connect
    assert "Traceback" not in output, output  # one line, not a library's traceback
    assert_no_secret(output)


def test_migrate_accepts_a_key_value_dsn_and_does_not_print_its_password(pg_server: PostgresServer) -> None:
    name = "secrets_" + uuid.uuid4().hex[:8]
    url = pg_server.create_database(name)
    try:
        # The test server trusts loopback: the password is sent and ignored, which is enough
        # to see where it would be printed.
        dsn = make_conninfo(url, password=AT_PASSWORD)
        assert "=" in dsn and "://" not in dsn
        code, output = run_cli(["migrate"], process_env(dsn, "127.0.0.1:1"))
        assert code == 0, output
        assert "applied" in output and "already up to date" not in output, output
        assert_no_secret(output)
        with Metastore(url) as store:
            assert store.list_sources() == []  # the schema is there
    finally:
        pg_server.drop_database(name)


def test_a_spark_connect_token_is_not_logged_nor_shown_when_the_server_is_unreachable(
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    topic = make_topic(partitions=1)
    source, spec = write_spec(tmp_path, topic)
    apply_spec(database_url, spec)
    master = f"sc://127.0.0.1:{free_port()}/;token={TOKEN};user_id=ingest"
    env = process_env(database_url, kafka_bootstrap, INGEST_SPARK_MASTER=master, INGEST_SPARK_START_TIMEOUT_S="5")
    code, output = run_cli(["worker", source], env, timeout=180)
    assert code != 0, output
    assert "could not start Spark" in output and "INGEST_SPARK_START_TIMEOUT_S" in output, output
    assert "spark_starting" in output, output  # the log names the master it tried, redacted
    assert_no_secret(output)
    with Metastore(database_url) as store:
        assert_no_secret(json.dumps(store.recent_errors(source), default=str))


def test_source_history_does_not_print_credentials_of_an_old_spec(
    database_url: str,
    tmp_path: Path,
) -> None:
    # Today a store URI with credentials is refused at apply; a spec stored by an older
    # release may still carry them.
    source, spec = write_spec(tmp_path, "clicks", store="s3a://ingest-bucket/clicks")
    apply_spec(database_url, spec)
    with Metastore(database_url) as store, store._connection().cursor() as cur:
        cur.execute("SELECT spec FROM ingest_source_versions WHERE source = %s", (source,))
        old = cur.fetchone()["spec"]
        old["segment_store"] = f"s3a://AKIAEXAMPLE:{PASSWORD}/h1dden-tail@ingest-bucket/clicks"
        old["options"] = {"token": TOKEN}
        cur.execute(
            "INSERT INTO ingest_source_versions (source, version, spec, spec_text) VALUES (%s, 2, %s, '')",
            (source, Jsonb(old)),
        )
    env = process_env(database_url, "127.0.0.1:1")
    for argv in (["source", "history", source], ["source", "history", source, "--json"]):
        code, output = run_cli(argv, env)
        assert code == 0, output
        assert "segment_store" in output and "***" in output, output
        assert_no_secret(output)
