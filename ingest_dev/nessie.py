"""A local Iceberg REST catalog for the tests: :class:`LocalNessie` runs Project Nessie's server
(one Quarkus jar from Maven Central, fetched once by :func:`ingest_dev.maven.fetch_nessie`) on a
Java 21+ runtime (:func:`ingest_dev.java.ensure_java`), its Iceberg REST API at
:attr:`LocalNessie.url` (``/iceberg``), its version store in memory (a restart forgets every
table).

Nessie refuses ``file://`` warehouses: its warehouse is a prefix of an S3 bucket (the tests'
moto server, reached path-style at ``s3_endpoint``). The bucket's keys are read by Nessie from
a Quarkus configuration file in the server's base directory (``config/application.properties``,
mode 0600), never from its command line, which ``ps`` shows.

Each test works on a Nessie branch of its own (:meth:`LocalNessie.create_branch`): a client that
names the branch as the catalog's ``prefix`` sees only the tables of that branch, so tests that
share one server never see each other's tables.

This module must not import pytest: the demo may use it too.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self

from ingest_dev.java import ensure_java
from ingest_dev.maven import fetch_nessie, nessie_version
from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import LOOPBACK, free_port

#: Nessie 0.99 is built for Java 21 (its Quarkus 3.15).
NESSIE_MIN_JAVA = 21
#: The warehouse's name in Nessie (the only one; the default).
WAREHOUSE = "warehouse"
# As the schema registry's: the client JIT alone starts a Quarkus server in less CPU time, and a
# test catalog answers a few hundred requests.
_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
_SECRET_NAME = "ingest-s3"


class LocalNessie(ManagedProcess):
    """Nessie on 127.0.0.1, its HTTP API and its management interface each on a free loopback
    port, ready once the Iceberg REST API answers ``GET /iceberg/v1/config``. Its warehouse is
    ``warehouse`` (an ``s3://bucket/prefix``) on the S3 API at ``s3_endpoint``, path-style, with
    the given keys."""

    kind = "the Iceberg REST catalog (Nessie)"
    log_name = "nessie.log"
    dir_prefix = "ingest-nessie-"
    probe_interval_s = 0.1

    def __init__(
        self,
        s3_endpoint: str,
        warehouse: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        base_dir: Path | None = None,
        heap_mb: int = 256,
    ) -> None:
        super().__init__(base_dir)
        self._s3 = (s3_endpoint, warehouse, region)
        self._keys = (access_key, secret_key)
        self._heap_mb = heap_mb
        self._port: int | None = None
        self._management_port: int | None = None
        self.started_in_s: float | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalNessie is not started")
        return self._port

    @property
    def url(self) -> str:
        """The Iceberg REST API's base URL (a REST catalog's ``uri``)."""
        return f"http://{LOOPBACK}:{self.port}/iceberg"

    @property
    def warehouse(self) -> str:
        return self._s3[1]

    def describe(self) -> str:
        return f"Project Nessie {nessie_version(fetch_nessie())} (in memory) at {self.url}, warehouse {self.warehouse}"

    def catalog_properties(self, branch: str = "main") -> dict[str, str]:
        """The pyiceberg (and Iceberg Java) REST catalog properties of a branch of this server."""
        return {"type": "rest", "uri": self.url, "prefix": branch}

    def create_branch(self, name: str | None = None) -> str:
        """A new branch from ``main`` (Nessie's API v2), empty of the tables other tests made
        on branches of their own; its name."""
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        api = f"http://{LOOPBACK}:{self.port}/api/v2/trees"
        with urllib.request.urlopen(f"{api}/main", timeout=10) as resp:
            main = json.loads(resp.read())["reference"]
        request = urllib.request.Request(
            f"{api}?name={name}&type=BRANCH",
            data=json.dumps(main).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
        return name

    def start(self, ready_timeout: float = 120.0) -> Self:
        if self.is_running():
            raise RuntimeError(f"LocalNessie already running at {self.url}")
        jar = fetch_nessie()
        java = ensure_java(NESSIE_MIN_JAVA)
        started = time.monotonic()
        self._run_start(
            lambda: self._retry_on_free_ports(lambda: self._launch(jar, java, ready_timeout), self._pick_ports)
        )
        self.started_in_s = time.monotonic() - started
        return self

    def stop(self, timeout: float = 20.0) -> None:
        self._halt(crash=False, timeout=timeout)
        if self._cleanup():
            self._port = self._management_port = None

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        def serves_config() -> bool:
            with urllib.request.urlopen(f"{self.url}/v1/config", timeout=2) as resp:
                return bool(resp.status == 200)

        return serves_config

    def _port_in_use(self, tail: str) -> bool:
        return "Address already in use" in tail or "seems to be in use" in tail

    def _not_ready(self) -> str:
        return f"answer GET {self.url}/v1/config"

    # -- internals

    def _pick_ports(self) -> str:
        self._port, self._management_port = free_port(), free_port()
        return f"{self._port} or {self._management_port}"

    def _write_secrets(self) -> None:
        """The S3 keys, where Quarkus reads them (``config/`` of the working directory)."""
        config = self.base_dir / "config"
        config.mkdir(exist_ok=True)
        path = config / "application.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{_SECRET_NAME}.name={self._keys[0]}\n{_SECRET_NAME}.secret={self._keys[1]}\n")

    def _launch(self, jar: Path, java: Path, ready_timeout: float) -> None:
        endpoint, warehouse, region = self._s3
        s3 = "nessie.catalog.service.s3.default-options"
        props = {
            "quarkus.http.host": LOOPBACK,
            "quarkus.http.port": str(self._port),
            # Without these the management interface listens on 0.0.0.0:9000.
            "quarkus.management.host": LOOPBACK,
            "quarkus.management.port": str(self._management_port),
            "nessie.catalog.default-warehouse": WAREHOUSE,
            f"nessie.catalog.warehouses.{WAREHOUSE}.location": warehouse,
            f"{s3}.endpoint": endpoint,
            f"{s3}.path-style-access": "true",
            f"{s3}.region": region,
            f"{s3}.access-key": f"urn:nessie-secret:quarkus:{_SECRET_NAME}",
            # Clients use S3 keys of their own: pyiceberg cannot sign through Nessie, and Iceberg
            # 1.12's signer client does not reach Nessie 0.99's signing endpoint.
            f"{s3}.request-signing-enabled": "false",
        }
        self._write_secrets()
        cmd = [str(java), f"-Xmx{self._heap_mb}m", *_JVM_OPTIONS]
        cmd += [f"-D{key}={value}" for key, value in props.items()]
        cmd += ["-jar", str(jar)]
        self._spawn(cmd, ready_timeout)
