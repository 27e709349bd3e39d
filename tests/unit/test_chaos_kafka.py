"""The chaos run's Kafka clients (tests/chaos_kafka.py) without a broker: the workers' settings
and the run's own clients' come from one derivation, and the password check finds it wherever
it shows. The secured run itself: tests/acceptance/test_chaos_quick.py (``s3-avro``)."""

from __future__ import annotations

from pathlib import Path

from ingest.config import Settings
from tests.chaos_kafka import ScramLogin, kafka_clients, secret_shown

PASSWORD = "chaos+Pa55/!"


def _secured(tmp_path: Path) -> ScramLogin:
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    return ScramLogin(PASSWORD, secret, tmp_path / "ca.pem")


def test_a_worker_reads_the_settings_the_runs_own_clients_use_its_password_from_the_file(tmp_path: Path) -> None:
    clients = kafka_clients("127.0.0.1:9093", _secured(tmp_path))
    env = {"INGEST_DATABASE_URL": "postgresql://x@127.0.0.1:1/db", "INGEST_KAFKA_BOOTSTRAP": clients.bootstrap}
    settings = Settings.from_env({**env, **clients.worker_env})
    assert {"bootstrap.servers": settings.kafka_bootstrap, **settings.kafka_properties} == clients.config()
    assert clients.config()["security.protocol"] == "SASL_SSL"
    assert clients.config()["sasl.mechanism"] == "SCRAM-SHA-512"
    assert clients.config()["ssl.ca.location"] == str(tmp_path / "ca.pem")
    assert PASSWORD not in "".join(clients.worker_env.values())
    plain = kafka_clients("127.0.0.1:9092")
    assert plain.config() == {"bootstrap.servers": "127.0.0.1:9092"} and not plain.worker_env


def test_the_password_is_found_in_any_process_log_or_output(tmp_path: Path) -> None:
    clients = kafka_clients("127.0.0.1:9093", _secured(tmp_path))
    (tmp_path / "w0.log").write_text('{"event": "worker_started"}\n')
    (tmp_path / "compactor-1.log").write_text(f'{{"event": "x", "config": "sasl.password={PASSWORD}"}}\n')
    assert secret_shown(clients, tmp_path, {"ingest audit": "audit chaos: OK"}) == (3, ["compactor-1.log"])
    (tmp_path / "compactor-1.log").write_text('{"event": "x", "config": "sasl.password=[redacted]"}\n')
    assert secret_shown(clients, tmp_path, {"ingest audit": "audit chaos: OK"}) == (3, [])
    assert secret_shown(clients, tmp_path, {"ingest audit": PASSWORD}) == (3, ["ingest audit"])
    assert secret_shown(kafka_clients("127.0.0.1:9092"), tmp_path, {"ingest audit": PASSWORD}) == (0, [])
