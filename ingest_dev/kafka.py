"""A local Apache Kafka broker for the demo, the tests, the chaos run and the benchmark:
:class:`LocalKafka` runs a single KRaft node from the jars pinned by ``scripts/kafka/pom.xml``
(fetched once from Maven Central by :func:`ingest_dev.maven.fetch_kafka`).

With a :class:`BrokerSecurity` it also listens, beside its PLAINTEXT listener (which the
tests' own clients keep using), on a SASL_SSL listener (SCRAM-SHA-512 and PLAIN for the users
given, OAUTHBEARER with unsecured tokens) and on an SSL listener that requires a client certificate (mutual TLS); the
certificates come from :func:`ingest_dev.certs.make_certificates`. The controller and the
inter-broker listener stay PLAINTEXT on loopback.

This module must not import pytest: the demo uses it too.
"""

from __future__ import annotations

import base64
import logging
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from ingest.kafka_java import jaas_quote
from ingest_dev.certs import TestCertificates
from ingest_dev.maven import fetch_kafka, kafka_version
from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import LOOPBACK, free_port

#: Extra JVM options for the development brokers (scripts/test sets ``-XX:TieredStopAtLevel=1``).
DEV_JAVA_OPTIONS_ENV = "INGEST_DEV_JAVA_OPTIONS"

# A logger keeps librdkafka's "Connection refused" lines off stderr: they are expected
# while the broker starts, and the last error is in the TimeoutError if it never answers.
PROBE_LOG = logging.getLogger(__name__ + ".broker_probe")
PROBE_LOG.setLevel(logging.CRITICAL)


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("no Java runtime (JAVA_HOME or java on PATH); run scripts/setup.sh")
    return java


def _kafka_cluster_id() -> str:
    # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding; the storage
    # tool refuses ids that start with '-' (they read as an option).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


# Broker settings for one node on loopback.  Replication 1 everywhere (one broker); few
# partitions for the internal topics (each is loaded at start-up); no rebalance delay; the
# KIP-848 group timeouts lowered to what the tests use under the classic protocol (6 s); retention and the
# log cleaner checked every second so retention and compaction tests run in seconds.
_KAFKA_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
}
# Root logger at WARN to broker.log; the one INFO line kept says the broker has started.
_KAFKA_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


@dataclass(frozen=True)
class BrokerSecurity:
    """The secured listeners of a :class:`LocalKafka`: SASL_SSL with SCRAM-SHA-512 for
    ``scram_users`` and PLAIN for ``plain_users`` (name -> password; SCRAM credentials are
    written into the log at format time) and OAUTHBEARER with unsecured tokens, and SSL with a
    client certificate required. Both present the broker's certificate of ``certificates`` and
    trust its ``ca``."""

    certificates: TestCertificates
    scram_users: Mapping[str, str] = field(default_factory=dict)
    plain_users: Mapping[str, str] = field(default_factory=dict)

    def broker_settings(self, sasl_ssl_port: int, ssl_port: int) -> dict[str, str]:
        """What the broker's properties add (its listeners, advertised ones and the map are
        made by :class:`LocalKafka`)."""
        jaas_users = " ".join(f"user_{name}={jaas_quote(password)}" for name, password in self.plain_users.items())
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certificates.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certificates.ca),
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN,OAUTHBEARER",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {jaas_users};"
            ),
            # Kafka's default OAUTHBEARER validator: any unsecured (unsigned) token is accepted.
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
            ),
        }

    def format_args(self) -> list[str]:
        """The storage tool's arguments that write the SCRAM credentials."""
        args: list[str] = []
        for name, password in self.scram_users.items():
            args += ["--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]"]
        return args


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\")


class LocalKafka(ManagedProcess):
    """A single-node Apache Kafka (KRaft, combined broker and controller) on 127.0.0.1.

    Runs the jars pinned by ``scripts/kafka/pom.xml`` (fetched by :func:`fetch_kafka`).
    ``base_dir`` holds ``data/`` (the log, formatted by Kafka's storage tool at the first
    start), ``server.properties``, ``log4j2.yaml`` and ``broker.log``.  When ``base_dir`` is
    None a temporary directory is created and removed by :meth:`stop`.  :meth:`restart`
    keeps ports and data: topics, records, committed offsets and groups survive it.
    ``overrides`` replace or add broker settings; ``security`` adds the secured listeners
    (:attr:`sasl_ssl_bootstrap`, :attr:`ssl_bootstrap`).
    """

    kind = "kafka"
    log_name = "broker.log"
    dir_prefix = "ingest-kafka-"
    # librdkafka's errors (KafkaException) while the broker starts.
    probe_errors = (Exception,)

    def __init__(
        self,
        base_dir: Path | None = None,
        heap_mb: int = 512,
        overrides: Mapping[str, str] | None = None,
        security: BrokerSecurity | None = None,
    ) -> None:
        super().__init__(base_dir)
        self._heap_mb = heap_mb
        self._overrides = dict(overrides or {})
        self._security = security
        self._port: int | None = None
        self._controller_port: int | None = None
        # The secured listeners' ports (SASL_SSL, SSL), with ``security`` only.
        self._secure_ports: tuple[int, int] | None = None
        self.started_in_s: float | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalKafka is not started")
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The SASL_SSL listener (SCRAM-SHA-512, PLAIN)."""
        return f"{LOOPBACK}:{self._secure()[0]}"

    @property
    def ssl_bootstrap(self) -> str:
        """The SSL listener (a client certificate required)."""
        return f"{LOOPBACK}:{self._secure()[1]}"

    def _secure(self) -> tuple[int, int]:
        if self._secure_ports is None:
            raise RuntimeError("LocalKafka has no secured listeners (security=None) or is not started")
        return self._secure_ports

    @property
    def version(self) -> str:
        return kafka_version()

    def describe(self) -> str:
        """One line for the demo, the chaos run and the bench: which broker, where."""
        return f"Apache Kafka {self.version} (KRaft, single node) at {self.bootstrap}"

    def start(self, ready_timeout: float = 60.0) -> Self:
        if self.is_running():
            raise RuntimeError(f"LocalKafka already running on {self.bootstrap}")
        libs = fetch_kafka()
        started = time.monotonic()

        def launch() -> None:
            if self._port is not None:
                # A restart keeps its ports: clients hold the bootstrap address.
                self._launch(libs, ready_timeout)
            else:
                self._retry_on_free_ports(lambda: self._launch(libs, ready_timeout), self._pick_ports)

        self._run_start(launch)
        self.started_in_s = time.monotonic() - started
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the broker; its data directory goes with it when this object created it."""
        # A directory this object owns is deleted next: a controlled shutdown would save nothing.
        self._halt(crash=self._owns_dir, timeout=timeout)
        if self._cleanup():
            self._port = self._controller_port = self._secure_ports = None

    def restart(self, crash: bool = False, down_s: float = 0.0, timeout: float = 20.0) -> None:
        """:meth:`halt`, stay down ``down_s``, :meth:`start` again on the same ports with the same data."""
        self.halt(crash=crash, timeout=timeout)
        time.sleep(down_s)
        self.start()

    def lose_partition_log(self, topic: str, partition: int, timeout: float = 20.0) -> None:
        """What an unclean leader election does to a partition, on one node: stop the broker,
        delete the partition's log directory (records and leader-epoch checkpoint), start it
        again. The partition comes back empty under a higher leader epoch (the restart bumps
        it), so records produced next take the offsets of the lost ones."""
        self.halt(timeout=timeout)
        shutil.rmtree(self.base_dir / "data" / f"{topic}-{partition}")
        self.start()

    def halt(self, crash: bool = False, timeout: float = 20.0) -> None:
        """Stop the broker process (SIGTERM, a controlled shutdown; SIGKILL with ``crash``)
        and keep its ports and data for :meth:`start`."""
        self._halt(crash=crash, timeout=timeout)

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000}, logger=PROBE_LOG
        )
        # Ready when a metadata request answers and lists this broker.
        return lambda: bool(admin.list_topics(timeout=1).brokers)

    def _not_ready(self) -> str:
        return f"answer metadata on {self.bootstrap}"

    # -- internals

    def _pick_ports(self) -> str:
        self._port, self._controller_port = free_port(), free_port()
        ports = [self._port, self._controller_port]
        if self._security is not None:
            self._secure_ports = (free_port(), free_port())
            ports += self._secure_ports
        return " or ".join(map(str, ports))

    def _write_config(self) -> Path:
        settings = dict(_KAFKA_SETTINGS)
        listeners = {"PLAINTEXT": self._port}
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        if self._security is not None:
            sasl_ssl, ssl = self._secure()
            listeners.update({"SASL_SSL": sasl_ssl, "SSL": ssl})
            protocols += ",SASL_SSL:SASL_SSL,SSL:SSL"
            settings.update(self._security.broker_settings(sasl_ssl, ssl))
        advertised = ",".join(f"{name}://{LOOPBACK}:{port}" for name, port in listeners.items())
        settings.update(
            {
                "listeners": f"{advertised},CONTROLLER://{LOOPBACK}:{self._controller_port}",
                "advertised.listeners": advertised,
                "listener.security.protocol.map": protocols,
                "controller.quorum.voters": f"1@{LOOPBACK}:{self._controller_port}",
                "log.dirs": str(self.base_dir / "data"),
            }
        )
        settings.update(self._overrides)
        path = self.base_dir / "server.properties"
        # A properties file: a backslash (a JAAS line's escapes) is written escaped.
        lines = (f"{key}={_escaped(value)}\n" for key, value in settings.items())
        path.write_text("".join(lines), encoding="utf-8")
        (self.base_dir / "log4j2.yaml").write_text(_KAFKA_LOG4J2, encoding="utf-8")
        return path

    def _java_cmd(self, libs: Path, main: str, *args: str, heap_mb: int) -> list[str]:
        return [
            _java(),
            f"-Xmx{heap_mb}m",
            f"-Xms{min(heap_mb, 128)}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            # scripts/test sets C1 only here (short runs; see docs/testing.md), benches never do.
            *shlex.split(os.environ.get(DEV_JAVA_OPTIONS_ENV, "")),
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.yaml'}",
            "-cp",
            str(libs / "*"),
            main,
            *args,
        ]

    def _format_if_needed(self, libs: Path, config: Path) -> None:
        if (self.base_dir / "data" / "meta.properties").is_file():
            return
        scram = self._security.format_args() if self._security is not None else []
        cmd = self._java_cmd(
            libs,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _kafka_cluster_id(),
            "-c",
            str(config),
            *scram,
            heap_mb=256,
        )
        result = subprocess.run(
            cmd, cwd=self.base_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"kafka-storage format failed (exit {result.returncode}):\n"
                + result.stdout.decode("utf-8", errors="replace")[-4000:]
            )

    def _launch(self, libs: Path, ready_timeout: float) -> None:
        config = self._write_config()
        self._format_if_needed(libs, config)
        self._spawn(self._java_cmd(libs, "kafka.Kafka", str(config), heap_mb=self._heap_mb), ready_timeout)
