"""The spec's [table] section: a catalog's properties, never a secret; secrets from the
environment (a value or a file), hidden wherever they appear; and the REST requests' fix-up
for servers that need an add-schema's last-column-id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest.spec.table import TableSettings, catalog_env, env_name
from ingest.table.catalog import _with_last_column_id
from ingest_common.errors import ConfigError
from ingest_common.redact import forget_secrets, redact

BASE: dict[str, Any] = {"name": "clicks", "topics": ["clicks"], "schema": {"ts": "timestamp"}, "event_time": "ts"}


def test_a_catalog_round_trips_through_json_and_a_spec_without_one_uses_the_metastores() -> None:
    doc = {
        **BASE,
        "table": {"catalog": {"type": "rest", "uri": "https://cat.example/iceberg", "rest.sigv4-enabled": True}},
    }
    spec = spec_from_dict(doc)
    assert dict(spec.table.catalog) == {
        "type": "rest",
        "uri": "https://cat.example/iceberg",
        "rest.sigv4-enabled": "true",
    }
    assert SourceSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.table.describe() == "the rest catalog at https://cat.example/iceberg"
    plain = spec_from_dict(BASE)
    assert not plain.table.external
    stored = plain.to_json()
    del stored["table"]  # a spec stored before [table] existed
    assert SourceSpec.from_json(stored).table == TableSettings()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"catalog": {"type": "rest", "token": "t0ps3cret"}}, "table.catalog.token: a secret is never written"),
        ({"catalog": {"type": "rest", "credential": "id:s3cret"}}, "set INGEST_TABLE_CATALOG__CREDENTIAL (or "),
        ({"catalog": {"type": "glue", "s3.secret-access-key": "k3y"}}, "INGEST_TABLE_CATALOG__S3__SECRET_ACCESS_KEY"),
        ({"catalog": {"type": "rest", "header.Authorization": "Bearer x"}}, "table.catalog.header.Authorization"),
        ({"catalog": {"type": "sql", "uri": "postgresql://u:pw@db/cat"}}, "table.catalog.uri: a password is never"),
        ({"catalog": {"type": "in-memory"}}, "table.catalog.type: 'in-memory' is not one of rest, glue"),
        ({"catalog": {"uri": "https://x"}}, "table.catalog.type: None is not one of"),
        ({"catalog": {"type": "rest", "nested": {"a": 1}}}, "table.catalog.nested: expected a string"),
        ({"catalog": {}}, "table.catalog: expected a table of pyiceberg catalog properties"),
        ({"warehouse": "s3://x"}, "table: unknown field(s) warehouse; allowed: catalog"),
    ],
)
def test_a_catalog_with_a_secret_or_an_unknown_type_is_refused_in_one_line(table: Any, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        spec_from_dict({**BASE, "table": table})
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
    for secret in ("t0ps3cret", "s3cret", "k3y", "pw@"):
        assert secret not in str(refused.value)


def test_secrets_come_from_the_environment_or_a_file_and_are_redacted(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("file-s3cret-token\n")
    env = {
        "INGEST_TABLE_CATALOG__TOKEN_FILE": str(token),
        "INGEST_TABLE_CATALOG__S3__SECRET_ACCESS_KEY": "env-s3cret-key",
        "INGEST_TABLE_CATALOG__WAREHOUSE": "s3://bucket/wh",
        "INGEST_OTHER": "x",
    }
    assert catalog_env(env) == {
        "token": "file-s3cret-token",
        "s3.secret-access-key": "env-s3cret-key",
        "warehouse": "s3://bucket/wh",
    }
    assert env_name("s3.secret-access-key") == "INGEST_TABLE_CATALOG__S3__SECRET_ACCESS_KEY"
    with pytest.raises(ConfigError, match="INGEST_TABLE_CATALOG__TOKEN_FILE: cannot read"):
        catalog_env({"INGEST_TABLE_CATALOG__TOKEN_FILE": str(tmp_path / "missing")})


def test_opening_a_catalog_registers_its_secrets_for_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secret-named properties from the environment are hidden in every line that leaves the
    process, even before the catalog answers (here it never does)."""
    from ingest.table.catalog import open_catalog
    from ingest.table.errors import CatalogUnavailable
    from ingest_dev.testkit import LOOPBACK, free_port

    forget_secrets()
    monkeypatch.setenv("INGEST_TABLE_CATALOG__TOKEN", "tok-9f8e7d6c")
    table = TableSettings((("type", "rest"), ("uri", f"http://{LOOPBACK}:{free_port()}/iceberg")))
    try:
        with pytest.raises(CatalogUnavailable, match="is unavailable"):
            open_catalog("", table)
        assert redact("Authorization: Bearer tok-9f8e7d6c") == "Authorization: Bearer ***"
    finally:
        forget_secrets()


def test_an_add_schema_update_gets_its_last_column_id() -> None:
    schema = {
        "type": "struct",
        "schema-id": 1,
        "fields": [
            {"id": 1, "name": "a", "type": "long", "required": False},
            {
                "id": 2,
                "name": "tags",
                "required": False,
                "type": {"type": "list", "element-id": 7, "element": "string"},
            },
        ],
    }
    body = json.dumps({"updates": [{"action": "add-schema", "schema": schema}, {"action": "set-current-schema"}]})
    patched = _with_last_column_id(body.encode())
    assert patched is not None
    assert json.loads(patched)["updates"][0]["last-column-id"] == 7
    # Nothing to add: the body is sent as it is.
    assert _with_last_column_id(json.dumps({"updates": [{"action": "set-properties"}]})) is None
    assert _with_last_column_id(b"not json") is None
    given = json.dumps({"updates": [{"action": "add-schema", "schema": schema, "last-column-id": 9}]})
    assert _with_last_column_id(given) is None
