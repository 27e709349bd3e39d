from pathlib import Path

import pytest

from ingest.config import WARM_UP_RECORDS, Settings, consumer_config
from ingest.errors import ConfigError


def test_kafka_properties_pass_through_but_protocol_settings_win(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("# SASL\nsasl.mechanism=PLAIN\nenable.auto.commit=true\n")
    settings = Settings.from_env(
        {
            "INGEST_DATABASE_URL": "postgresql://x@h/db",
            "INGEST_KAFKA_BOOTSTRAP": "k:9092",
            "INGEST_KAFKA_CONFIG_FILE": str(props),
            "INGEST_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
            "INGEST_KAFKA_PROP_PARTITION_ASSIGNMENT_STRATEGY": "range",
            "INGEST_KAFKA_PROP_ENABLE_AUTO_OFFSET_STORE": "true",
        }
    )
    conf = consumer_config(settings, "ingest-s")
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "PLAIN"
    assert conf["partition.assignment.strategy"] == "range"
    assert conf["enable.auto.commit"] == "false" and conf["enable.auto.offset.store"] == "false"
    assert conf["group.id"] == "ingest-s" and conf["bootstrap.servers"] == "k:9092"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({}, "INGEST_DATABASE_URL"),
        ({"INGEST_DATABASE_URL": "postgresql://h/db"}, "INGEST_KAFKA_BOOTSTRAP"),
        ({"INGEST_METRICS_PORT": "99999"}, "INGEST_METRICS_PORT"),
        ({"INGEST_BUILD_THREADS": "0"}, "INGEST_BUILD_THREADS"),
        ({"INGEST_LOG_FORMAT": "xml"}, "INGEST_LOG_FORMAT"),
        ({"INGEST_FAULT_PUBLISH_DELAY_S": "-1"}, "INGEST_FAULT_PUBLISH_DELAY_S"),
        ({"INGEST_WARM_UP_RECORDS": "-1"}, "INGEST_WARM_UP_RECORDS"),
        ({"INGEST_WARM_UP_RECORDS": "2k"}, "INGEST_WARM_UP_RECORDS"),
        # Unicode digits pass str.isdigit() but not int(): still a ConfigError, not a traceback.
        ({"INGEST_WARM_UP_RECORDS": "²"}, "INGEST_WARM_UP_RECORDS"),
        ({"INGEST_BUILD_THREADS": "²"}, "INGEST_BUILD_THREADS"),
        ({"INGEST_METRICS_PORT": "²"}, "INGEST_METRICS_PORT"),
        ({"INGEST_BUILD_LINGER_S": "nan"}, "INGEST_BUILD_LINGER_S"),
        ({"INGEST_BUILD_LINGER_S": "inf"}, "INGEST_BUILD_LINGER_S"),
        ({"INGEST_KAFKA_CONFIG_FILE": "/nonexistent/client.properties"}, "INGEST_KAFKA_CONFIG_FILE"),
        ({"INGEST_UNHEALTHY_AFTER_PUBLISH_STALL_S": "0"}, "INGEST_UNHEALTHY_AFTER_PUBLISH_STALL_S"),
        # Read by every metastore connection, checked at start.
        ({"INGEST_DB_STATEMENT_TIMEOUT_S": "0"}, "INGEST_DB_STATEMENT_TIMEOUT_S"),
        ({"INGEST_DB_TCP_USER_TIMEOUT_S": "nan"}, "INGEST_DB_TCP_USER_TIMEOUT_S"),
        ({"INGEST_DB_KEEPALIVES_COUNT": "2.5"}, "INGEST_DB_KEEPALIVES_COUNT"),
        ({"INGEST_DB_CONNECT_TIMEOUT_S": "-1"}, "INGEST_DB_CONNECT_TIMEOUT_S"),
    ],
)
def test_invalid_settings_name_the_variable(env: dict[str, str], field: str) -> None:
    full = {"INGEST_DATABASE_URL": "postgresql://h/db", "INGEST_KAFKA_BOOTSTRAP": "k:9092", **env}
    if field in ("INGEST_DATABASE_URL", "INGEST_KAFKA_BOOTSTRAP"):
        full = env
    with pytest.raises(ConfigError, match=field):
        Settings.from_env(full)


def test_warm_up_records_default_and_zero() -> None:
    base = {"INGEST_DATABASE_URL": "postgresql://h/db", "INGEST_KAFKA_BOOTSTRAP": "k:9092"}
    assert Settings.from_env(base).warm_up_records == WARM_UP_RECORDS
    assert Settings.from_env({**base, "INGEST_WARM_UP_RECORDS": "0"}).warm_up_records == 0


def test_a_kafka_config_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_bytes(b"security.protocol=SSL\nsasl.password=\xff\xfe\n")
    env = {
        "INGEST_DATABASE_URL": "postgresql://h/db",
        "INGEST_KAFKA_BOOTSTRAP": "k:9092",
        "INGEST_KAFKA_CONFIG_FILE": str(path),
    }
    with pytest.raises(ConfigError, match=r"INGEST_KAFKA_CONFIG_FILE.*not UTF-8"):
        Settings.from_env(env)
