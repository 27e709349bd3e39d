"""ingest_common.redact: what is hidden, whole, and what stays readable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingest.config import Settings
from ingest_common import redact

SECRET = "s3cr3t-Pa55"


@pytest.fixture(autouse=True)
def _no_registered_secrets() -> Iterator[None]:
    redact.forget_secrets()
    yield
    redact.forget_secrets()


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"postgresql://ingest:{SECRET}@db.example:5432/ingest", "db.example:5432/ingest"),
        # An unencoded @ in the password: everything up to the last @ of the authority goes.
        (f"postgresql://ingest:{SECRET}@tail@db.example/ingest", "@db.example/ingest"),
        (f"postgresql://db.example/ingest?user=ingest&password={SECRET}&sslmode=require", "sslmode=require"),
        (f"host=db.example user=ingest password={SECRET} dbname=ingest", "dbname=ingest"),
        (f"host=db.example password='{SECRET} with blanks' dbname=ingest", "dbname=ingest"),
        (f"sc://spark.example:15002/;token={SECRET};user_id=ingest", "user_id=ingest"),
        # AWS secret keys contain '/'.
        (f"s3a://AKIAEXAMPLE:{SECRET}/with/slashes@bucket/clicks", "@bucket/clicks"),
        (f"sasl.password={SECRET}", "sasl.password="),
    ],
)
def test_patterns_hide_the_secret_whole(text: str, kept: str) -> None:
    out = redact.redact(text)
    assert SECRET not in out and "with blanks" not in out and "slashes" not in out
    assert "***" in out and kept in out, out


@pytest.mark.parametrize(
    "text",
    [
        "file:///tmp/store@2026/segments",
        "http://127.0.0.1:9090/metrics",
        "postgresql://ingest@db/ingest",
        "tokens_read=5 records=7",
    ],
)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact.redact(text) == text


def test_registered_values_are_hidden_in_any_wrapping() -> None:
    redact.register_secrets([SECRET, "ab"])  # too short to register: would hide ordinary words
    assert (
        redact.redact(f"connect failed: {{'sasl.password': '{SECRET}'}} (ab)")
        == "connect failed: {'sasl.password': '***'} (ab)"
    )


def test_json_like_values_hide_secret_keys_and_values() -> None:
    doc = {
        "segment_store": f"s3a://AKIAEXAMPLE:{SECRET}@bucket/x",
        "options": {"token": "t0k3n-value"},
        "schema": [["id", "long"]],
    }
    out = redact.redact_value(doc)
    assert out == {
        "segment_store": "s3a://AKIAEXAMPLE:***@bucket/x",
        "options": {"token": "***"},
        "schema": [["id", "long"]],
    }


def test_settings_name_their_secrets() -> None:
    settings = Settings.from_env(
        {
            "INGEST_DATABASE_URL": f"host=db user=ingest password='{SECRET}' dbname=ingest",
            "INGEST_KAFKA_BOOTSTRAP": "127.0.0.1:9",
            "INGEST_KAFKA_PROP_SASL_PASSWORD": "sasl-h1dden",
            "INGEST_KAFKA_PROP_SASL_USERNAME": "ingest",
            "INGEST_SPARK_MASTER": "sc://spark:15002/;token=t0k3n-value;use_ssl=true",
        }
    )
    assert sorted(settings.secret_values()) == sorted([SECRET, "sasl-h1dden", "t0k3n-value"])


def test_secrets_read_from_the_environment_are_hidden() -> None:
    """AWS credentials (S3A, pyarrow, the Iceberg catalog's file IO) and libpq's PGPASSWORD are
    read from the environment by name, never through a setting: their values are registered too."""
    env = {
        "INGEST_DATABASE_URL": "postgresql://ingest@db.example/ingest",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLEsessionTOKEN",
        "PGPASSWORD": "pg-h1dden",
    }
    settings = Settings.from_env(env, require_kafka=False)
    redact.register_secrets(settings.secret_values())
    # As a library may print its properties: no key=value pair for the patterns to catch.
    text = redact.redact(
        f"catalog failed: {{'s3.access-key-id': 'AKIAEXAMPLE',"
        f" 's3.secret-access-key': '{env['AWS_SECRET_ACCESS_KEY']}',"
        f" 's3.session-token': '{env['AWS_SESSION_TOKEN']}'}}; fe_sendauth with {env['PGPASSWORD']}"
    )
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD"):
        assert env[name] not in text, text
    assert "AKIAEXAMPLE" in text  # a key id is not a secret
    assert env["AWS_SECRET_ACCESS_KEY"] not in repr(settings)


def test_the_structlog_processor_covers_keys_values_and_tracebacks() -> None:
    redact.register_secrets([SECRET])
    event = {
        "event": "worker_started",
        "spark_master": f"sc://h:1/;token={SECRET}",
        "password": "x1",
        "exception": f"Traceback ...\nBadConnectionURI: 'password={SECRET}'",
        "records": 5,
    }
    out = redact.structlog_processor(None, "info", event)
    assert SECRET not in repr(out) and out["password"] == "***" and out["records"] == 5
