"""Real local servers for the demo and the tests, without Docker.

- :class:`LocalPostgres` runs a throw-away PostgreSQL cluster from the Debian packages
  (``/usr/lib/postgresql/*/bin``).  PostgreSQL refuses to run as root, so when this
  process is root, ``initdb`` and ``postgres`` run as the ``postgres`` OS user.
- :class:`LocalKafka` runs Apache Kafka (a single KRaft node) from the jars pinned by
  ``scripts/kafka/pom.xml``, fetched once from Maven Central by :func:`fetch_kafka`.
- :func:`create_topic` / :func:`produce_records` are small, time-bounded admin and
  producer helpers that work against any Kafka cluster.

This module must not import pytest: the demo uses it too.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ingest.spark_jars import SPARK_JARS_POM, maven_cache, spark_jars_dir

log = logging.getLogger(__name__)
_PROBE_LOG = logging.getLogger(__name__ + ".broker_probe")
_PROBE_LOG.setLevel(logging.CRITICAL)

_LOOPBACK = "127.0.0.1"
_PG_OS_USER = "postgres"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it).

    There is a small race between closing the probe socket and a server binding the port;
    the servers below retry on a fresh port when the bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"


def _stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig`` to the process, wait up to ``timeout``, then SIGKILL its process group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored signal %d for %.1f s; killing its process group", proc.pid, sig, timeout)
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Every server is started in its own process group (process_group=0), so the group
    # id is the pid.  Killing the whole group matters for PostgreSQL: orphaned backends
    # would keep the shared memory segment attached and block the next start.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# --------------------------------------------------------------------------- PostgreSQL


class PostgresServer(Protocol):
    """What tests and the demo need from a PostgreSQL server they may create databases on."""

    @property
    def url(self) -> str: ...

    def database_url(self, name: str) -> str: ...

    def create_database(self, name: str, template: str | None = None) -> str: ...

    def drop_database(self, name: str) -> None: ...


def database_url_for(server_url: str, name: str) -> str:
    """``server_url`` with its database (the URL path) replaced by ``name``; user, host and query kept."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(name, safe=""), parts.query, parts.fragment))


def create_database_on(server_url: str, name: str, template: str | None = None, timeout: float = 10.0) -> str:
    """``CREATE DATABASE name [TEMPLATE template]`` through ``server_url`` (a superuser URL).

    Returns the new database's URL.  PostgreSQL refuses to copy a template while anyone
    is connected to it (``55006 object_in_use``, after waiting 5 s).  A template database
    is never used for real work, so sessions left on it (e.g. a migration tool's pooled
    connection) are terminated first, and the copy is retried until ``timeout``.
    """
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
    deadline = time.monotonic() + timeout
    # CREATE DATABASE cannot run inside a transaction block: autocommit.
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as conn:
        while True:
            if template is not None:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (template,),
                )
            try:
                conn.execute(stmt)
                break
            except pg_errors.ObjectInUse:
                # A terminated backend may take a moment to exit, or a new session arrived.
                if template is None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    return database_url_for(server_url, name)


def drop_database_on(server_url: str, name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: terminates sessions still connected to it."""
    stmt = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(stmt)


class ExternalPostgres:
    """A server someone else runs (``INGEST_TEST_DATABASE_URL``, a container): only a superuser URL."""

    def __init__(self, url: str) -> None:
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def database_url(self, name: str) -> str:
        return database_url_for(self._url, name)

    def create_database(self, name: str, template: str | None = None) -> str:
        return create_database_on(self._url, name, template)

    def drop_database(self, name: str) -> None:
        drop_database_on(self._url, name)


def find_pg_bindir() -> Path:
    """Directory holding ``initdb`` and ``postgres``: highest /usr/lib/postgresql/<v>/bin, else PATH."""
    candidates: list[tuple[int, Path]] = []
    for bindir in glob.glob("/usr/lib/postgresql/*/bin"):
        version = Path(bindir).parent.name
        if version.isdigit() and (Path(bindir) / "postgres").is_file() and (Path(bindir) / "initdb").is_file():
            candidates.append((int(version), Path(bindir)))
    if candidates:
        return max(candidates)[1]
    initdb = shutil.which("initdb")
    if initdb is not None and (Path(initdb).parent / "postgres").is_file():
        return Path(initdb).parent
    raise FileNotFoundError(
        "PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/postgres, no initdb on PATH); "
        "install them with scripts/setup.sh (Debian package 'postgresql')"
    )


class LocalPostgres:
    """A private PostgreSQL cluster on 127.0.0.1 (trust auth, superuser ``postgres``).

    ``base_dir`` holds ``data/`` (the cluster), ``sock/`` (the Unix socket) and
    ``postgres.log``.  When ``base_dir`` is None a temporary directory is created and
    removed by :meth:`stop`; a given ``base_dir`` is kept, and an existing cluster in it
    is reused (as root, the ``postgres`` user must be able to reach ``base_dir``; only
    ``base_dir`` itself is chowned).  ``fast`` turns off fsync and full_page_writes:
    durability against *OS* crashes is lost, but process crashes (:meth:`restart` with
    ``crash=True``) lose no committed transaction, since commits still reach the page cache.
    """

    def __init__(self, base_dir: Path | None = None, fast: bool = True) -> None:
        self._owns_dir = base_dir is None
        self._base_dir = base_dir
        self._fast = fast
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._bindir = find_pg_bindir()
        # PostgreSQL refuses to run as root (it would own every file it writes).
        self._as_pg_user = os.geteuid() == 0

    # -- public API

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalPostgres is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{_LOOPBACK}:{self.port}/postgres"

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError("LocalPostgres is not started")
        return self._base_dir

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    def database_url(self, name: str) -> str:
        return database_url_for(self.url, name)

    def create_database(self, name: str, template: str | None = None) -> str:
        return create_database_on(self.url, name, template)

    def drop_database(self, name: str) -> None:
        drop_database_on(self.url, name)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalPostgres:
        if self.is_running():
            raise RuntimeError(f"LocalPostgres already running on port {self.port}")
        if self._base_dir is None:
            # Short path under /tmp: the Unix socket path must stay below ~107 bytes.
            self._base_dir = Path(tempfile.mkdtemp(prefix="ingest-pg-"))
        self._base_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._initdb_if_needed()
            if self._port is not None:
                # A restart keeps its port: clients hold URLs with it.
                self._launch(self._port)
            else:
                self._launch_on_free_port()
        except BaseException:
            self._close_log()
            if self._owns_dir:
                self._remove_dir()
            raise
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT: abort transactions, checkpoint), SIGKILL after ``timeout``."""
        self._stop_server(crash=False, timeout=timeout)
        if self._owns_dir:
            self._remove_dir()
            self._port = None

    def restart(self, crash: bool = False, timeout: float = 15.0) -> None:
        """Stop and start again on the same port and data directory (data survives).

        ``crash=True`` SIGKILLs the whole server process group instead of a clean
        shutdown, so the next start runs crash recovery from the WAL.
        """
        self._stop_server(crash=crash, timeout=timeout)
        self.start()

    def outage(self, seconds: float, crash: bool = True) -> None:
        """Make the server unreachable for ``seconds``: stop it (SIGKILL by default), wait,
        start it again on the same port with the same data."""
        self._stop_server(crash=crash, timeout=15.0)
        time.sleep(seconds)
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals

    @property
    def _data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def _sock_dir(self) -> Path:
        return self.base_dir / "sock"

    def _user_kwargs(self) -> dict[str, Any]:
        if self._as_pg_user:
            return {"user": _PG_OS_USER, "group": _PG_OS_USER, "extra_groups": []}
        return {}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Stable, installed locale; the caller's LANG may name one that is not generated.
        env["LC_ALL"] = "C.UTF-8"
        env.pop("PGDATA", None)
        return env

    def _chown_for_server(self, *paths: Path) -> None:
        # Only the directories the server creates files in; data/ itself is created (and
        # owned) by initdb running as that user.
        if self._as_pg_user:
            for path in paths:
                shutil.chown(path, _PG_OS_USER, _PG_OS_USER)

    def _initdb_if_needed(self) -> None:
        self._sock_dir.mkdir(exist_ok=True)
        # initdb creates data/ itself (mode 0700): the parent must be writable by its user.
        self._chown_for_server(self.base_dir, self._sock_dir)
        if (self._data_dir / "PG_VERSION").is_file():
            return
        cmd = [
            str(self._bindir / "initdb"),
            "-D", str(self._data_dir),
            "-A", "trust",
            "-U", "postgres",
            "--no-sync",
            "--locale=C.UTF-8",
            "-E", "UTF8",
        ]  # fmt: skip
        started = time.monotonic()
        result = subprocess.run(
            cmd,
            cwd=self.base_dir,  # the postgres user must be able to stat its cwd
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
            **self._user_kwargs(),
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed (exit {result.returncode}) in {self._data_dir}:\n"
                + result.stdout.decode("utf-8", errors="replace")
            )
        log.debug("initdb took %.2f s", time.monotonic() - started)

    def _launch_on_free_port(self, attempts: int = 5) -> None:
        for attempt in range(attempts):
            port = free_port()
            try:
                self._launch(port)
                return
            except _PortInUse:
                # Lost the race between free_port() and bind: another process took it.
                log.info("port %d taken before postgres bound it (attempt %d); retrying", port, attempt + 1)
        raise RuntimeError(f"could not find a free port for postgres after {attempts} attempts")

    def _launch(self, port: int, ready_timeout: float = 10.0) -> None:
        cmd = [
            str(self._bindir / "postgres"),
            "-D", str(self._data_dir),
            "-p", str(port),
            "-k", str(self._sock_dir),
            "-c", "listen_addresses=" + _LOOPBACK,
            "-c", "max_connections=200",
        ]  # fmt: skip
        if self._fast:
            # synchronous_commit stays on: with fsync=off a commit costs one write() to the
            # page cache, and it is what makes restart(crash=True) lose no committed
            # transaction (with it off, the last ~200 ms of commits die with the process).
            cmd += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        self._close_log()
        self._log_fh = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.base_dir,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            # Own process group: a terminal Ctrl-C does not reach the server directly, and
            # crash() can kill postmaster and backends together.
            process_group=0,
            **self._user_kwargs(),
        )
        self._port = port
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            _kill_group(self._proc)
            self._proc = None
            raise

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = _log_tail(self.log_path)
                if "could not bind" in tail and "Address already in use" in tail:
                    raise _PortInUse(tail)
                raise RuntimeError(
                    f"postgres exited with code {self._proc.returncode} during startup;"
                    f" log tail ({self.log_path}):\n{tail}"
                )
            try:
                with psycopg.connect(self.url, connect_timeout=1) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last_error = exc
                time.sleep(0.02)
        raise TimeoutError(
            f"postgres did not accept connections on port {self.port} within {timeout:.1f} s"
            f" (last error: {last_error}); log tail ({self.log_path}):\n{_log_tail(self.log_path)}"
        )

    def _stop_server(self, crash: bool, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if crash:
                _kill_group(proc)
            else:
                _stop_process(proc, signal.SIGINT, timeout)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _remove_dir(self) -> None:
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None


class _PortInUse(RuntimeError):
    pass


# --------------------------------------------------------------------------- Apache Kafka

KAFKA_POM = Path(__file__).resolve().parent.parent / "scripts" / "kafka" / "pom.xml"
KAFKA_LIBS_ENV = "INGEST_KAFKA_LIBS"


def _maven_fetch(pom: Path, libs: Path, what: str, complete: Callable[[Path], bool], timeout: float) -> Path:
    """Copy the dependencies a pom pins from Maven Central into ``libs`` (once). Maven writes
    into a sibling temporary directory that is renamed into place, so an interrupted fetch
    never leaves a half-filled classpath behind."""
    if complete(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FileNotFoundError(
            f"{what} jars are not fetched and Maven is not installed; "
            "run scripts/setup.sh (Debian packages 'maven' and 'openjdk-17-jre-headless')"
        )
    libs.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=libs.parent))
    try:
        result = subprocess.run(
            [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={staging}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0 or not complete(staging):
            raise RuntimeError(
                f"mvn could not fetch {what} (exit {result.returncode}):\n"
                + result.stdout.decode("utf-8", errors="replace")[-4000:]
            )
        staging.rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def kafka_libs_dir() -> Path:
    """Where the broker's jars live: ``$INGEST_KAFKA_LIBS``, else the Maven cache of
    ``scripts/kafka/pom.xml``."""
    explicit = os.environ.get(KAFKA_LIBS_ENV)
    return Path(explicit) if explicit else maven_cache(KAFKA_POM, "kafka")


def fetch_kafka(timeout: float = 600.0) -> Path:
    """The pinned Kafka jars, fetched from Maven Central into :func:`kafka_libs_dir` once."""
    return _maven_fetch(KAFKA_POM, kafka_libs_dir(), "Apache Kafka", lambda d: _kafka_jar(d) is not None, timeout)


def _kafka_jar(libs: Path) -> Path | None:
    jars = sorted(libs.glob("kafka_2.13-*.jar")) if libs.is_dir() else []
    return jars[0] if jars else None


# ------------------------------------------------------------ Spark's object-store connectors


def _has_hadoop_aws(libs: Path) -> bool:
    return libs.is_dir() and any(libs.glob("hadoop-aws-*.jar"))


def fetch_spark_jars(timeout: float = 600.0) -> Path:
    """hadoop-aws, the AWS SDK modules it uses and the committer binding
    (``scripts/spark-jars/pom.xml``), fetched from Maven Central once."""
    return _maven_fetch(SPARK_JARS_POM, spark_jars_dir(), "Spark's S3 connector", _has_hadoop_aws, timeout)


def kafka_version(libs: Path | None = None) -> str:
    """The version of the fetched broker, from its jar's name (``kafka_2.13-4.4.0.jar``)."""
    jar = _kafka_jar(libs or kafka_libs_dir())
    if jar is None:
        raise FileNotFoundError(f"no kafka_2.13 jar in {libs or kafka_libs_dir()}; run scripts/setup.sh")
    return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")


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


class LocalKafka:
    """A single-node Apache Kafka (KRaft, combined broker and controller) on 127.0.0.1.

    Runs the jars pinned by ``scripts/kafka/pom.xml`` (fetched by :func:`fetch_kafka`).
    ``base_dir`` holds ``data/`` (the log, formatted by Kafka's storage tool at the first
    start), ``server.properties``, ``log4j2.yaml`` and ``broker.log``.  When ``base_dir`` is
    None a temporary directory is created and removed by :meth:`stop`.  :meth:`restart`
    keeps ports and data: topics, records, committed offsets and groups survive it.
    ``overrides`` replace or add broker settings.
    """

    def __init__(
        self, base_dir: Path | None = None, heap_mb: int = 512, overrides: Mapping[str, str] | None = None
    ) -> None:
        self._base_dir = base_dir
        self._owns_dir = base_dir is None
        self._heap_mb = heap_mb
        self._overrides = dict(overrides or {})
        self._port: int | None = None
        self._controller_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self.started_in_s: float | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalKafka is not started")
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"{_LOOPBACK}:{self.port}"

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError("LocalKafka is not started")
        return self._base_dir

    @property
    def log_path(self) -> Path:
        return self.base_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def version(self) -> str:
        return kafka_version()

    def describe(self) -> str:
        """One line for the demo, the chaos run and the bench: which broker, where."""
        return f"Apache Kafka {self.version} (KRaft, single node) at {self.bootstrap}"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, ready_timeout: float = 60.0) -> LocalKafka:
        if self.is_running():
            raise RuntimeError(f"LocalKafka already running on {self.bootstrap}")
        libs = fetch_kafka()
        if self._base_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="ingest-kafka-"))
        self._base_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            if self._port is not None:
                # A restart keeps its ports: clients hold the bootstrap address.
                self._launch(libs, ready_timeout)
            else:
                self._launch_on_free_ports(libs, ready_timeout)
        except BaseException:
            self._close_log()
            if self._owns_dir:
                self._remove_dir()
            raise
        self.started_in_s = time.monotonic() - started
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the broker; its data directory goes with it when this object created it."""
        if self._owns_dir:
            # The data is deleted next: a controlled shutdown would save nothing.
            self._stop_broker(crash=True, timeout=timeout)
            self._remove_dir()
            self._port = self._controller_port = None
        else:
            self._stop_broker(crash=False, timeout=timeout)

    def restart(self, crash: bool = False, down_s: float = 0.0, timeout: float = 20.0) -> None:
        """:meth:`halt`, stay down ``down_s``, :meth:`start` again on the same ports with the same data."""
        self.halt(crash=crash, timeout=timeout)
        time.sleep(down_s)
        self.start()

    def halt(self, crash: bool = False, timeout: float = 20.0) -> None:
        """Stop the broker process (SIGTERM, a controlled shutdown; SIGKILL with ``crash``)
        and keep its ports and data for :meth:`start`."""
        self._stop_broker(crash=crash, timeout=timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals

    def _launch_on_free_ports(self, libs: Path, ready_timeout: float, attempts: int = 5) -> None:
        for attempt in range(attempts):
            self._port, self._controller_port = free_port(), free_port()
            try:
                self._launch(libs, ready_timeout)
                return
            except _PortInUse:
                log.info(
                    "port %d or %d taken before kafka bound it (attempt %d); retrying",
                    self._port,
                    self._controller_port,
                    attempt + 1,
                )
        raise RuntimeError(f"could not find free ports for kafka after {attempts} attempts")

    def _write_config(self) -> Path:
        settings = dict(_KAFKA_SETTINGS)
        settings.update(
            {
                "listeners": f"PLAINTEXT://{_LOOPBACK}:{self._port},CONTROLLER://{_LOOPBACK}:{self._controller_port}",
                "advertised.listeners": f"PLAINTEXT://{_LOOPBACK}:{self._port}",
                "controller.quorum.voters": f"1@{_LOOPBACK}:{self._controller_port}",
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
        self._close_log()
        self._log_fh = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self._java_cmd(libs, "kafka.Kafka", str(config), heap_mb=self._heap_mb),
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            _kill_group(self._proc)
            self._proc = None
            raise

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        # A logger keeps librdkafka's "Connection refused" lines off stderr: they are expected
        # while the broker starts, and the last error is in the TimeoutError if it never answers.
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000}, logger=_PROBE_LOG
        )
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = _log_tail(self.log_path)
                if "Address already in use" in tail:
                    raise _PortInUse(tail)
                raise RuntimeError(
                    f"kafka exited with code {self._proc.returncode} during startup;"
                    f" log tail ({self.log_path}):\n{tail}"
                )
            try:
                # Ready when a metadata request answers and lists this broker.
                if admin.list_topics(timeout=1).brokers:
                    return
            except Exception as exc:  # KafkaException; a broker still starting
                last_error = exc
            time.sleep(0.05)
        raise TimeoutError(
            f"kafka did not answer metadata on {self.bootstrap} within {timeout:.1f} s"
            f" (last error: {last_error}); log tail ({self.log_path}):\n{_log_tail(self.log_path)}"
        )

    def _stop_broker(self, crash: bool, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if crash:
                _kill_group(proc)
            else:
                _stop_process(proc, signal.SIGTERM, timeout)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _remove_dir(self) -> None:
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None


# ------------------------------------------------------------------ a local S3 API (tests)


class LocalS3:
    """An S3 API server on a free loopback port (moto's server mode, from PyPI), with one
    bucket, for the object-store tests, the chaos run and the benchmark. ``env`` is what a
    process needs to reach it: the usual AWS variables, which pyarrow and (through
    ``ingest.spark``) Spark's S3A connector both read; never anything in a spec."""

    def __init__(self, bucket: str = "ingest", start_timeout: float = 30.0) -> None:
        self.bucket = bucket
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "ingest-test",
            "AWS_SECRET_ACCESS_KEY": "ingest-test-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3a://{self.bucket}", *parts])

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalS3:
        import sys

        self.port = free_port()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from ingest_dev.embedded import serve_local_s3; serve_local_s3({self.port})"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._start_timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the S3 API server (moto) did not start on port {self.port}") from None
                time.sleep(0.1)
        from pyarrow import fs as pafs

        s3 = pafs.S3FileSystem(
            access_key=self.env["AWS_ACCESS_KEY_ID"],
            secret_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region=self.env["AWS_REGION"],
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=True,
        )
        s3.create_dir(self.bucket)
        return self

    def record(self, on: bool) -> None:
        """Start (after clearing) or stop the server's request recorder (``requests()`` reads it)."""
        import urllib.request

        action = "start" if on else "stop"
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}{_RECORDER_PATH}{action}", method="POST"), timeout=10
        ).close()

    def requests(self) -> list[dict[str, Any]]:
        """The requests recorded since ``record(True)``: method, url (path and query), headers."""
        import urllib.request

        with urllib.request.urlopen(f"{self.endpoint}{_RECORDER_PATH}requests", timeout=30) as resp:
            entries: list[dict[str, Any]] = json.loads(resp.read())
        return entries

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None


_RECORDER_PATH = "/_ingest/recorder/"


class _RequestRecorder:
    """WSGI middleware in front of moto: while on, keeps each request's method, path and query,
    and headers (no bodies) in memory under a lock. moto's own recorder writes whole bodies,
    base64-encoded, to a file in its working directory, and concurrent uploads interleave there."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._on = False
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith(_RECORDER_PATH):
            action = path[len(_RECORDER_PATH) :]
            with self._lock:
                if action == "start":
                    self._entries, self._on = [], True
                elif action == "stop":
                    self._on = False
                body = json.dumps(self._entries if action == "requests" else "ok").encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if self._on:
            query = environ.get("QUERY_STRING", "")
            headers = {
                key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
            }
            entry = {
                "method": environ.get("REQUEST_METHOD", ""),
                "url": path + ("?" + query if query else ""),
                "headers": headers,
            }
            with self._lock:
                self._entries.append(entry)
        return self._app(environ, start_response)


def serve_local_s3(port: int) -> None:
    """The S3 API server LocalS3 runs (moto's, on 127.0.0.1) with a request recorder."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", port, _RequestRecorder(DomainDispatcherApplication(create_backend_app)), threaded=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m ingest_dev.embedded fetch-kafka | fetch-spark-jars``: fetch jars from Maven
    Central into the cache (scripts/setup.sh)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args == ["fetch-kafka"]:
        libs = fetch_kafka()
        print(f"Apache Kafka {kafka_version(libs)}: {libs}")
        return 0
    if args == ["fetch-spark-jars"]:
        jars = fetch_spark_jars()
        print(f"Spark's S3 connector ({len(list(jars.glob('*.jar')))} jars): {jars}")
        return 0
    print("usage: python -m ingest_dev.embedded fetch-kafka | fetch-spark-jars", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- Kafka helpers


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1) and wait until usable.

    Returns once the broker's metadata lists every partition with a leader.  An existing
    topic with the same partition count is accepted (idempotent); a different count raises.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"topic {name!r}: not all {partitions} partitions had leaders within {timeout:.1f} s")
        # All-topics metadata: asking for one topic by name could auto-create it.
        metadata = admin.list_topics(timeout=max(0.1, min(remaining, 5.0)))
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None:
            if len(topic.partitions) not in (0, partitions):
                raise ValueError(f"topic {name!r} exists with {len(topic.partitions)} partitions, wanted {partitions}")
            if len(topic.partitions) == partitions and all(
                p.leader >= 0 and p.error is None for p in topic.partitions.values()
            ):
                return
        time.sleep(0.05)


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 10) -> None:
    """Delete topics (best effort for cleanup: raises on the first failure after trying all)."""
    from confluent_kafka.admin import AdminClient

    names = list(names)
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    errors: list[str] = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout)
        except Exception as exc:
            errors.append(f"{topic}: {exc}")
    if errors:
        raise RuntimeError("delete_topics failed: " + "; ".join(errors))


def end_offsets(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """Every partition's log end offset (high watermark) as the broker reports it now."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ingest-end-offsets", "enable.auto.commit": False},
        logger=_PROBE_LOG,
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        return {
            p: int(consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=timeout)[1])
            for p in partitions
        }
    finally:
        consumer.close()


def produce_records(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[int | None, bytes | None, bytes | None]],
    timeout: float = 60,
    config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Produce ``(partition, key, value)`` records and return each partition's log end offset.

    ``partition=None`` lets the partitioner choose from the key (``murmur2_random``, the
    Java client's scheme).  The log end of a partition is its highest delivered offset + 1,
    taken from the delivery reports: the ground truth of what this call wrote (with a
    transactional or idempotent producer the broker's high watermark may lie beyond it,
    past control records).  Raises on any
    delivery error, or ``TimeoutError`` if not everything is delivered within ``timeout``.
    ``config`` overrides producer settings (e.g. ``{"batch.num.messages": 1}``).
    """
    from confluent_kafka import KafkaError, Message, Producer

    deadline = time.monotonic() + timeout
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": f"produce-records-{uuid.uuid4().hex[:8]}",
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "batch.size": 4 * 1024 * 1024,
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "partitioner": "murmur2_random",
        # Every record must be delivered (or fail) before our own deadline.
        "message.timeout.ms": max(1000, int(timeout * 1000)),
    }
    if config:
        conf.update(config)
    producer = Producer(conf)
    log_end: dict[int, int] = {}
    failures: list[str] = []
    produced = 0
    delivered = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered
        delivered += 1
        if err is not None:
            failures.append(f"partition {msg.partition()}: {err}")
            return
        partition = msg.partition()
        offset = msg.offset()
        # A delivered message always carries both; the stubs say Optional.
        assert partition is not None and offset is not None
        if offset + 1 > log_end.get(partition, 0):
            log_end[partition] = offset + 1

    for partition, key, value in records:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"produce_records: local queue still full after {timeout:.1f} s")
            try:
                if partition is None:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                else:
                    producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                # Local queue full: serve delivery reports to make room.
                producer.poll(0.05)
        produced += 1
        if failures:
            break
        if produced % 10000 == 0:
            producer.poll(0)
    remaining_msgs = producer.flush(max(0.0, deadline - time.monotonic()))
    if failures:
        raise RuntimeError(f"produce_records to {topic!r}: {len(failures)} delivery error(s), first: {failures[0]}")
    if remaining_msgs > 0 or delivered != produced:
        raise TimeoutError(
            f"produce_records to {topic!r}: {produced - delivered} of {produced} records undelivered"
            f" after {timeout:.1f} s"
        )
    return log_end


if __name__ == "__main__":
    raise SystemExit(main())
