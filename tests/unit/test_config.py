from pathlib import Path
from typing import Any

import pytest

from ingest.cli import main
from ingest.config import PROTOCOL_PROPERTIES, WARM_UP_RECORDS, Settings, consumer_config
from ingest.errors import ConfigError

BASE = {"INGEST_DATABASE_URL": "postgresql://x@127.0.0.1:1/db", "INGEST_KAFKA_BOOTSTRAP": "k:9092"}


def test_kafka_properties_pass_through_and_the_protocol_settings_are_pinned(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    # A pinned property restated with its pinned value (any case) is no override.
    props.write_text("# SASL\nsasl.mechanism=PLAIN\nenable.auto.commit=false\n")
    settings = Settings.from_env(
        {
            **BASE,
            "INGEST_KAFKA_CONFIG_FILE": str(props),
            "INGEST_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
            "INGEST_KAFKA_PROP_PARTITION_ASSIGNMENT_STRATEGY": "range",
            "INGEST_KAFKA_PROP_ISOLATION_LEVEL": "READ_COMMITTED",
        }
    )
    conf = consumer_config(settings, "ingest-s")
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "PLAIN"
    assert conf["partition.assignment.strategy"] == "range"
    assert conf["group.id"] == "ingest-s" and conf["bootstrap.servers"] == "k:9092"
    assert {name: conf[name] for name in PROTOCOL_PROPERTIES} == {
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "auto.offset.reset": "error",
        "enable.partition.eof": "true",
        "isolation.level": "read_committed",
    }
    # Settings made in code (tests, embedding) get the pinned values whatever they carry.
    made = Settings("postgresql://x@h/db", "k:9092", kafka_properties={"isolation.level": "read_uncommitted"})
    assert consumer_config(made, "ingest-s")["isolation.level"] == "read_committed"


@pytest.mark.parametrize(
    ("name", "value", "because"),
    [
        ("isolation.level", "read_uncommitted", "records of aborted and open transactions would be published"),
        ("enable.auto.commit", "true", "the metastore's next_offset"),
        ("enable.auto.offset.store", "true", "the metastore's next_offset"),
        ("auto.offset.reset", "earliest", "gap ledger"),
        ("enable.partition.eof", "false", "confirmed valid by the end of the partition"),
    ],
)
@pytest.mark.parametrize("where", ["env", "file"])
def test_an_override_of_a_protocol_property_is_refused_in_one_line_naming_it(
    tmp_path: Path, name: str, value: str, because: str, where: str
) -> None:
    if where == "env":
        variable = "INGEST_KAFKA_PROP_" + name.upper().replace(".", "_")
        env = {**BASE, variable: value}
    else:
        variable = "INGEST_KAFKA_CONFIG_FILE"
        props = tmp_path / "client.properties"
        props.write_text(f"{name}={value}\n")
        env = {**BASE, variable: str(props)}
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{variable}: {name}={value} is refused")
    assert f"{name}={PROTOCOL_PROPERTIES[name]}" in message and because in message, message


def test_a_worker_given_read_uncommitted_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {**BASE, "INGEST_KAFKA_PROP_ISOLATION_LEVEL": "read_uncommitted"}.items():
        monkeypatch.setenv(key, value)
    assert main(["worker", "clicks"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ingest: error: INGEST_KAFKA_PROP_ISOLATION_LEVEL: isolation.level=read_uncommitted is refused"
    ), err


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
        ({"INGEST_TABLE_PASS_DEADLINE_S": "0"}, "INGEST_TABLE_PASS_DEADLINE_S"),
        ({"INGEST_COMPACT_PASS_DEADLINE_S": "inf"}, "INGEST_COMPACT_PASS_DEADLINE_S"),
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


def test_the_singleton_roles_pass_deadlines_default_and_set() -> None:
    base = {"INGEST_DATABASE_URL": "postgresql://h/db"}
    settings = Settings.from_env(base, require_kafka=False)
    assert (settings.table_pass_deadline_s, settings.compact_pass_deadline_s) == (120.0, 1800.0)
    env = {**base, "INGEST_TABLE_PASS_DEADLINE_S": "30", "INGEST_COMPACT_PASS_DEADLINE_S": "600.5"}
    settings = Settings.from_env(env, require_kafka=False)
    assert (settings.table_pass_deadline_s, settings.compact_pass_deadline_s) == (30.0, 600.5)


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


def test_every_consumer_the_worker_and_status_make_reads_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's consumers are made from consumer_config (above); ``ingest status`` reads
    the watermarks with one of its own, whose high watermark must be the last stable offset too."""
    from ingest.ops import status

    made: list[dict[str, Any]] = []

    class Reader:
        def get_watermark_offsets(self, _tp: object, timeout: float) -> tuple[int, int]:
            return 0, 10

        def close(self) -> None:
            pass

    def client(_factory: object, conf: dict[str, Any]) -> Reader:
        made.append(dict(conf))
        return Reader()

    monkeypatch.setattr(status, "kafka_client", client)
    assert status.watermarks(Settings.from_env(BASE), [("events", 0)]) == {("events", 0): (0, 10)}
    [conf] = made
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] in ("false", False)


def test_status_skips_a_partition_kafka_does_not_know_and_stops_at_one_it_does_not_answer_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from ingest.ops import status

    # What librdkafka answers, at once, for a deleted topic's partition (seen on Apache Kafka 4.4).
    answers = {
        ("gone", 0): KafkaError(KafkaError._UNKNOWN_PARTITION),
        ("events", 0): (0, 10),
        ("events", 1): KafkaError(KafkaError._TIMED_OUT),
        ("events", 2): (0, 7),
    }
    asked: list[tuple[str, int]] = []

    class Reader:
        def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
            asked.append((tp.topic, tp.partition))
            answer = answers[(tp.topic, tp.partition)]
            if isinstance(answer, KafkaError):
                raise KafkaException(answer)
            return answer

        def close(self) -> None:
            pass

    monkeypatch.setattr(status, "kafka_client", lambda _factory, _conf: Reader())
    marks = status.watermarks(Settings.from_env(BASE), list(answers))
    assert marks == {("events", 0): (0, 10)}
    assert asked == [("gone", 0), ("events", 0), ("events", 1)]
