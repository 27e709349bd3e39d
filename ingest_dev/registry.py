"""A local schema registry for the tests: :class:`LocalSchemaRegistry` runs Apicurio Registry
(its Quarkus application from Maven Central, fetched once by
:func:`ingest_dev.maven.fetch_schema_registry`) on a Java 21+ runtime
(:func:`ingest_dev.java.ensure_java`), and clients use its Confluent-compatible API at
:attr:`LocalSchemaRegistry.url`. :class:`ExternalSchemaRegistry` stands for one given by URL
(``INGEST_TEST_SCHEMA_REGISTRY_URL``). Nothing but the Confluent API is used, so any registry
that speaks it (Confluent's, Karapace, Redpanda's) serves the same tests; docs/schema-registry.md
lists what differs in Apicurio.

Storage is SQL, never Apicurio's default in-memory database: an H2 database file in the base
directory, or a PostgreSQL database when ``database_url`` is given. Either way a stop and a
start (:meth:`LocalSchemaRegistry.restart`, an outage) keep every schema, id and subject.

This module must not import pytest: the demo may use it too.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from psycopg.conninfo import conninfo_to_dict

from ingest_dev.java import ensure_java, runtime_version
from ingest_dev.maven import fetch_schema_registry, schema_registry_version
from ingest_dev.process import ManagedProcess, log_tail
from ingest_dev.testkit import LOOPBACK, free_port

#: Apicurio Registry 3 is built for Java 21 (class file version 65).
REGISTRY_MIN_JAVA = 21
#: Where the Confluent-compatible API lives on an Apicurio server.
CCOMPAT_PATH = "/apis/ccompat/v7"
# Start-up is JIT compilation and class loading, on 2 cores shared with the rest of a test run:
# the client JIT alone (C1) and a class-data archive of the classes a start loads
# (:func:`build_class_archive`) each cut its CPU time (docs/schema-registry.md has the numbers).
# A registry in tests answers a few hundred requests; C2's peak speed does not pay for itself.
_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


#: Every request of a development client is bounded: a reply the registry never sends (seen
#: once from Apicurio under load) is a timeout the client retries, never a hang.
CLIENT_TIMEOUT_S = 10


def client(url: str, **conf: Any) -> Any:
    """confluent-kafka's SchemaRegistryClient for producers, demos and tests, every request
    bounded (the product's own client: ingest.formats.registry.registry_client)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": CLIENT_TIMEOUT_S, **conf})


def class_archive(home: Path, java: Path) -> Path:
    """Where the class-data archive for this application and runtime lives (beside the
    application in the cache; a new JDK gets an archive of its own)."""
    return home.parent / f"classes-{runtime_version(java)}.jsa"


@dataclass(frozen=True)
class ExternalSchemaRegistry:
    """A registry the tests did not start; ``url`` is its Confluent-compatible base URL."""

    url: str

    def describe(self) -> str:
        return f"external schema registry at {self.url}"


def jdbc_settings(database_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """Apicurio's settings for SQL storage on the PostgreSQL database of a libpq URL: system
    properties, and the environment that carries the password (kept off the command line,
    which ``ps`` shows)."""
    params = conninfo_to_dict(database_url)
    host = str(params.get("host") or LOOPBACK)
    if host.startswith("/"):
        raise ValueError(f"the registry reaches PostgreSQL over TCP only, not the socket directory {host}")
    port = params.get("port") or "5432"
    props = {
        "apicurio.storage.sql.kind": "postgresql",
        "apicurio.datasource.url": f"jdbc:postgresql://{host}:{port}/{params['dbname']}",
        "apicurio.datasource.username": str(params.get("user") or "postgres"),
    }
    password = params.get("password")
    return props, ({"APICURIO_DATASOURCE_PASSWORD": str(password)} if password else {})


class LocalSchemaRegistry(ManagedProcess):
    """Apicurio Registry on 127.0.0.1, its HTTP API and its management interface (health,
    metrics) each on a free loopback port, ready once the Confluent API lists subjects.

    ``overrides`` add or replace Apicurio's settings (system properties); ``jvm_options`` go
    to the JVM after the defaults.
    ``base_dir`` holds ``registry.log`` and, without ``database_url``, the H2 database
    ``data/registry.mv.db``; a temporary one is created when it is None and removed by
    :meth:`stop`. :meth:`halt` and :meth:`start` (or :meth:`restart`) keep the ports and the
    stored schemas: clients keep their URL through an outage.
    """

    kind = "the schema registry (Apicurio)"
    log_name = "registry.log"
    dir_prefix = "ingest-registry-"
    # URLError and connection resets are OSErrors; a half-written response is an HTTPException.
    probe_errors = (OSError, http.client.HTTPException)
    probe_interval_s = 0.2

    def __init__(
        self,
        base_dir: Path | None = None,
        heap_mb: int = 256,
        database_url: str | None = None,
        overrides: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        super().__init__(base_dir)
        self._jvm_options = list(jvm_options)
        self._heap_mb = heap_mb
        self._database_url = database_url
        self._overrides = dict(overrides or {})
        self._port: int | None = None
        self._management_port: int | None = None
        self.started_in_s: float | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalSchemaRegistry is not started")
        return self._port

    @property
    def management_port(self) -> int:
        """The management interface's port (health at ``/health``, metrics at ``/metrics``)."""
        if self._management_port is None:
            raise RuntimeError("LocalSchemaRegistry is not started")
        return self._management_port

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``SchemaRegistryClient`` takes)."""
        return f"http://{LOOPBACK}:{self.port}{CCOMPAT_PATH}"

    def describe(self) -> str:
        storage = "PostgreSQL" if self._database_url else "an H2 file"
        return f"Apicurio Registry {schema_registry_version()} (storage: {storage}) at {self.url}"

    def start(self, ready_timeout: float = 120.0) -> Self:
        if self.is_running():
            raise RuntimeError(f"LocalSchemaRegistry already running at {self.url}")
        home = fetch_schema_registry()
        java = ensure_java(REGISTRY_MIN_JAVA)
        started = time.monotonic()

        def launch() -> None:
            if self._port is not None:
                # A start after halt() keeps the ports: clients hold the URL.
                self._launch(home, java, ready_timeout)
            else:
                self._retry_on_free_ports(lambda: self._launch(home, java, ready_timeout), self._pick_ports)

        self._run_start(launch)
        self.started_in_s = time.monotonic() - started
        return self

    def halt(self, crash: bool = False, timeout: float = 20.0) -> None:
        """Stop the server (SIGTERM; SIGKILL with ``crash``), keeping its ports and storage for :meth:`start`."""
        self._halt(crash=crash, timeout=timeout)

    def restart(self, crash: bool = False, down_s: float = 0.0, timeout: float = 20.0) -> None:
        """:meth:`halt`, stay down ``down_s``, :meth:`start` again on the same port with the same schemas."""
        self.halt(crash=crash, timeout=timeout)
        time.sleep(down_s)
        self.start()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server; its directory (and H2 database) goes with it when this object created it."""
        self._halt(crash=False, timeout=timeout)
        if self._cleanup():
            self._port = self._management_port = None

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        def lists_subjects() -> bool:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return bool(resp.status == 200)

        return lists_subjects

    def _port_in_use(self, tail: str) -> bool:
        return "Address already in use" in tail or "seems to be in use" in tail

    def _not_ready(self) -> str:
        return f"answer GET {self.url}/subjects"

    # -- internals

    def _pick_ports(self) -> str:
        self._port, self._management_port = free_port(), free_port()
        return f"{self._port} or {self._management_port}"

    def _settings(self) -> tuple[dict[str, str], dict[str, str]]:
        props = {
            "quarkus.http.host": LOOPBACK,
            "quarkus.http.port": str(self._port),
            # Without these the management interface listens on 0.0.0.0:9000, and two
            # registries on one machine clash there.
            "quarkus.management.host": LOOPBACK,
            "quarkus.management.port": str(self._management_port),
            # Apicurio keeps 20 connections open by default: too many for a test PostgreSQL.
            "apicurio.datasource.jdbc.initial-size": "2",
            "apicurio.datasource.jdbc.min-size": "2",
            "apicurio.datasource.jdbc.max-size": "10",
        }
        env: dict[str, str] = {}
        if self._database_url:
            storage, env = jdbc_settings(self._database_url)
            props.update(storage)
        else:
            props["apicurio.datasource.url"] = f"jdbc:h2:file:{self.base_dir / 'data' / 'registry'}"
        props.update(self._overrides)
        return props, env

    def _launch(self, home: Path, java: Path, ready_timeout: float) -> None:
        props, env = self._settings()
        cmd = [str(java), f"-Xmx{self._heap_mb}m", *_JVM_OPTIONS]
        archive = class_archive(home, java)
        if archive.is_file():
            # A stale or foreign archive is refused by the JVM with a warning, never fatal.
            cmd.append(f"-XX:SharedArchiveFile={archive}")
        cmd += self._jvm_options
        cmd += [f"-D{key}={value}" for key, value in props.items()]
        cmd += ["-jar", str(home / "quarkus-run.jar")]
        self._spawn(cmd, ready_timeout, env={**os.environ, **env})


def build_class_archive(timeout: float = 300.0) -> Path:
    """Record the classes a registry start loads into :func:`class_archive` (once per
    application and runtime): start one, register a schema and read it back (the Confluent
    API's classes), stop it; the JVM writes the archive as it exits. Written under a
    temporary name and renamed, so a registry never maps a half-written archive."""
    home = fetch_schema_registry()
    java = ensure_java(REGISTRY_MIN_JAVA)
    archive = class_archive(home, java)
    if archive.is_file():
        return archive
    staging = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    registry = LocalSchemaRegistry(jvm_options=[f"-XX:ArchiveClassesAtExit={staging}"])
    try:
        registry.start(ready_timeout=timeout)
        body = json.dumps({"schema": json.dumps({"type": "record", "name": "R", "fields": []})}).encode()
        request = urllib.request.Request(
            f"{registry.url}/subjects/warm-up/versions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            schema_id = json.loads(resp.read())["id"]
        with urllib.request.urlopen(f"{registry.url}/schemas/ids/{schema_id}", timeout=30) as resp:
            resp.read()
        registry.halt(timeout=timeout)
        if not staging.is_file():
            raise RuntimeError(f"the JVM wrote no class-data archive; log tail:\n{log_tail(registry.log_path)}")
        staging.rename(archive)
    finally:
        registry.stop()
        staging.unlink(missing_ok=True)
    return archive
