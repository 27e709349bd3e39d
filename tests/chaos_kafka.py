"""The chaos run's broker and the one way every client of the run reaches it
(``python -m tests.chaos --kafka-security plaintext|sasl_ssl``).

``plaintext``: the broker's PLAINTEXT listener. ``sasl_ssl``: the broker also listens on
SASL_SSL (ingest_dev.kafka.BrokerSecurity), and every client of the run uses that listener only,
with SCRAM-SHA-512 over TLS: the certificate authority is made at the run's start
(ingest_dev.certs), the password too. :func:`kafka_clients` derives the settings once: the
run's own producer, admin calls and end-offset reads take :meth:`KafkaClients.config`; the
workers, the compactor, the committers and the audit get :attr:`KafkaClients.worker_env`, whose
password is a secret file (``INGEST_KAFKA_PROP_SASL_PASSWORD_FILE``), from which Spark's Kafka
reader's Java properties are derived (ingest.kafka_java). A client of the secured run that
bootstraps on the SASL_SSL listener is handed the broker's SASL_SSL address in every metadata
answer (advertised per listener), so no connection of it reaches the PLAINTEXT one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest_dev.certs import make_certificates
from ingest_dev.kafka import BrokerSecurity, LocalKafka
from tests.acceptance.harness import kafka_prop_env, showing

KAFKA_SECURITY = ("plaintext", "sasl_ssl")
SCRAM_USER = "chaos"


@dataclass(frozen=True)
class KafkaClients:
    """How every client of the run reaches the broker: ``bootstrap`` with the librdkafka
    properties ``props`` (the run's own clients), or with ``worker_env`` added to an ``ingest``
    process's environment. ``secret``: the password that must show in no process's output."""

    bootstrap: str
    props: Mapping[str, str] = field(default_factory=dict)
    worker_env: Mapping[str, str] = field(default_factory=dict)
    secret: str | None = None

    def config(self, **extra: Any) -> dict[str, Any]:
        """A librdkafka client's configuration: the bootstrap, the security properties, ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.props, **extra}

    def describe(self) -> str:
        """One line for the run's log and summary: which listener the clients use, how."""
        protocol = self.props.get("security.protocol", "PLAINTEXT")
        mechanism = self.props.get("sasl.mechanism")
        how = f" ({mechanism}, a CA made for the run)" if mechanism else ""
        return f"clients on {protocol}{how} at {self.bootstrap}"


@dataclass(frozen=True)
class ScramLogin:
    """The secured run's login: its SCRAM-SHA-512 password (also in ``secret_file``, for the
    processes) and the certificate authority that signed the broker's certificate."""

    password: str
    secret_file: Path
    ca: Path


def kafka_clients(bootstrap: str, scram: ScramLogin | None = None) -> KafkaClients:
    """The one derivation of every client's settings for the listener at ``bootstrap``: PLAINTEXT
    without ``scram``, SASL_SSL with SCRAM-SHA-512 over TLS with it."""
    if scram is None:
        return KafkaClients(bootstrap)
    props = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": SCRAM_USER,
        "ssl.ca.location": str(scram.ca),
    }
    return KafkaClients(
        bootstrap,
        {**props, "sasl.password": scram.password},
        {**kafka_prop_env(props), "INGEST_KAFKA_PROP_SASL_PASSWORD_FILE": str(scram.secret_file)},
        scram.password,
    )


@contextlib.contextmanager
def chaos_broker(security: str, work: Path) -> Iterator[tuple[LocalKafka, KafkaClients]]:
    """The run's broker under ``work/broker``, started, and how its clients reach it."""
    if security not in KAFKA_SECURITY:
        raise ValueError(f"unknown Kafka security {security!r}; known: {', '.join(KAFKA_SECURITY)}")
    if security == "plaintext":
        with LocalKafka(base_dir=work / "broker") as broker:
            yield broker, kafka_clients(broker.bootstrap)
        return
    certs = make_certificates(work / "certs")
    # Characters a JAAS line must keep as they are; none that the storage tool's
    # ``--add-scram [name=..,password=..]`` would split on.
    password = f"chaos+{secrets.token_urlsafe(12)}/!"
    secret_file = work / "certs" / "kafka-password"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")  # as `echo` writes it: the line end is no part of it
    scram = ScramLogin(password, secret_file, certs.ca)
    with LocalKafka(base_dir=work / "broker", security=BrokerSecurity(certs, {SCRAM_USER: password})) as broker:
        yield broker, kafka_clients(broker.sasl_ssl_bootstrap, scram)


def secret_shown(kafka: KafkaClients, log_dir: Path, outputs: Mapping[str, str]) -> tuple[int, list[str]]:
    """Where the run's password shows, among the log of every ``ingest`` process the run started
    (``log_dir/NAME.log``: workers, compactors, committers) and ``outputs``: how many texts were
    searched and the ones it showed in; (0, []) on PLAINTEXT, which has no password."""
    if kafka.secret is None:
        return 0, []
    texts = {path.name: path.read_text(errors="replace") for path in sorted(log_dir.glob("*.log"))}
    texts.update(outputs)
    return len(texts), showing(kafka.secret, texts)
