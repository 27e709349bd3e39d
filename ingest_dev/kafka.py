"""A local Apache Kafka broker for the demo, the tests, the chaos run and the benchmark:
:class:`LocalKafka` runs a single KRaft node from the jars pinned by ``scripts/kafka/pom.xml``
(fetched once from Maven Central by :func:`ingest_dev.maven.fetch_kafka`).

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
from pathlib import Path
from typing import Self

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
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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


class LocalKafka(ManagedProcess):
    """A single-node Apache Kafka (KRaft, combined broker and controller) on 127.0.0.1.

    Runs the jars pinned by ``scripts/kafka/pom.xml`` (fetched by :func:`fetch_kafka`).
    ``base_dir`` holds ``data/`` (the log, formatted by Kafka's storage tool at the first
    start), ``server.properties``, ``log4j2.yaml`` and ``broker.log``.  When ``base_dir`` is
    None a temporary directory is created and removed by :meth:`stop`.  :meth:`restart`
    keeps ports and data: topics, records, committed offsets and groups survive it.
    ``overrides`` replace or add broker settings.
    """

    kind = "kafka"
    log_name = "broker.log"
    dir_prefix = "ingest-kafka-"
    # librdkafka's errors (KafkaException) while the broker starts.
    probe_errors = (Exception,)

    def __init__(
        self, base_dir: Path | None = None, heap_mb: int = 512, overrides: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(base_dir)
        self._heap_mb = heap_mb
        self._overrides = dict(overrides or {})
        self._port: int | None = None
        self._controller_port: int | None = None
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
            self._port = self._controller_port = None

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
        return f"{self._port} or {self._controller_port}"

    def _write_config(self) -> Path:
        settings = dict(_KAFKA_SETTINGS)
        settings.update(
            {
                "listeners": f"PLAINTEXT://{LOOPBACK}:{self._port},CONTROLLER://{LOOPBACK}:{self._controller_port}",
                "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self._port}",
                "controller.quorum.voters": f"1@{LOOPBACK}:{self._controller_port}",
                "log.dirs": str(self.base_dir / "data"),
            }
        )
        settings.update(self._overrides)
        path = self.base_dir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()), encoding="utf-8")
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
        cmd = self._java_cmd(
            libs, "kafka.tools.StorageTool", "format", "-t", _kafka_cluster_id(), "-c", str(config), heap_mb=256
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
