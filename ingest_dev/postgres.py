"""PostgreSQL for the demo and the tests: a server someone else runs (:class:`ExternalPostgres`)
or a throw-away local cluster (:class:`LocalPostgres`) from the Debian packages
(``/usr/lib/postgresql/*/bin``).  PostgreSQL refuses to run as root, so when this process is
root, ``initdb`` and ``postgres`` run as the ``postgres`` OS user.

This module must not import pytest: the demo uses it too.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import LOOPBACK, free_port, wait_until

log = logging.getLogger(__name__)

_PG_OS_USER = "postgres"


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
    last_error: list[Exception] = []
    # CREATE DATABASE cannot run inside a transaction block: autocommit.
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as conn:

        def created() -> bool:
            if template is not None:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (template,),
                )
            try:
                conn.execute(stmt)
                return True
            except pg_errors.ObjectInUse as exc:
                # A terminated backend may take a moment to exit, or a new session arrived.
                if template is None:
                    raise
                last_error[:] = [exc]
                return False

        wait_until(
            created, timeout, f"database {name} copied from {template}", interval=0.05, detail=lambda: str(last_error)
        )
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


class LocalPostgres(ManagedProcess):
    """A private PostgreSQL cluster on 127.0.0.1 (trust auth, superuser ``postgres``).

    ``base_dir`` holds ``data/`` (the cluster), ``sock/`` (the Unix socket) and
    ``postgres.log``.  When ``base_dir`` is None a temporary directory is created and
    removed by :meth:`stop`; a given ``base_dir`` is kept, and an existing cluster in it
    is reused (as root, the ``postgres`` user must be able to reach ``base_dir``; only
    ``base_dir`` itself is chowned).  ``fast`` turns off fsync and full_page_writes:
    durability against *OS* crashes is lost, but process crashes (:meth:`restart` with
    ``crash=True``) lose no committed transaction, since commits still reach the page cache.
    """

    kind = "postgres"
    log_name = "postgres.log"
    dir_prefix = "ingest-pg-"
    # Fast shutdown: abort transactions, checkpoint.
    stop_signal = signal.SIGINT
    probe_errors = (psycopg.OperationalError,)
    probe_interval_s = 0.02

    def __init__(self, base_dir: Path | None = None, fast: bool = True) -> None:
        super().__init__(base_dir)
        self._fast = fast
        self._port: int | None = None
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
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return database_url_for(self.url, name)

    def create_database(self, name: str, template: str | None = None) -> str:
        return create_database_on(self.url, name, template)

    def drop_database(self, name: str) -> None:
        drop_database_on(self.url, name)

    def start(self) -> Self:
        if self.is_running():
            raise RuntimeError(f"LocalPostgres already running on port {self.port}")
        self._run_start(self._initdb_and_launch)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT: abort transactions, checkpoint), SIGKILL after ``timeout``."""
        self._halt(crash=False, timeout=timeout)
        if self._cleanup():
            self._port = None

    def restart(self, crash: bool = False, timeout: float = 15.0) -> None:
        """Stop and start again on the same port and data directory (data survives).

        ``crash=True`` SIGKILLs the whole server process group instead of a clean
        shutdown, so the next start runs crash recovery from the WAL.
        """
        self._halt(crash=crash, timeout=timeout)
        self.start()

    def outage(self, seconds: float, crash: bool = True) -> None:
        """Make the server unreachable for ``seconds``: stop it (SIGKILL by default), wait,
        start it again on the same port with the same data."""
        self._halt(crash=crash, timeout=15.0)
        time.sleep(seconds)
        self.start()

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        def accepts() -> bool:
            with psycopg.connect(self.url, connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            return True

        return accepts

    def _port_in_use(self, tail: str) -> bool:
        return "could not bind" in tail and "Address already in use" in tail

    def _not_ready(self) -> str:
        return f"accept connections on port {self.port}"

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

    def _initdb_and_launch(self) -> None:
        self._initdb_if_needed()
        if self._port is not None:
            # A restart keeps its port: clients hold URLs with it.
            self._launch()
        else:
            self._retry_on_free_ports(self._launch, self._pick_port)

    def _pick_port(self) -> str:
        self._port = free_port()
        return str(self._port)

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

    def _launch(self, ready_timeout: float = 10.0) -> None:
        cmd = [
            str(self._bindir / "postgres"),
            "-D", str(self._data_dir),
            "-p", str(self.port),
            "-k", str(self._sock_dir),
            "-c", "listen_addresses=" + LOOPBACK,
            "-c", "max_connections=200",
        ]  # fmt: skip
        if self._fast:
            # synchronous_commit stays on: with fsync=off a commit costs one write() to the
            # page cache, and it is what makes restart(crash=True) lose no committed
            # transaction (with it off, the last ~200 ms of commits die with the process).
            cmd += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        self._spawn(cmd, ready_timeout, env=self._env(), **self._user_kwargs())
