"""A local Spark standalone cluster: a master and ``workers`` workers from the pyspark wheel's
own distribution (``bin/spark-class`` with Spark's ``Master`` and ``Worker`` classes, in the
foreground, as ``sbin/start-master.sh`` and ``start-worker.sh`` would run them but without
``spark-daemon.sh``, which would detach the JVMs from this process). Each process dies with the
one that started it (:func:`ingest_dev.process.popen`); a worker's executors are its children.

Every address is loopback. A worker offers ``cores`` cores and ``memory`` to the cluster; an
application (a worker's session with ``INGEST_SPARK_MASTER=spark://...``, or a Spark Connect
server started with ``--master spark://...``) gets executors on them, which read the splits'
records from Kafka: the driver only plans.

Used by the tests of reading through a cluster's executors and by ``python -m bench.fleet``'s cluster modes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import free_port, port_open, wait_until

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        {
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(base / "local"),
            # Tests and benches set SPARK_SUBMIT_OPTS for their drivers; the daemons take theirs here.
            "SPARK_DAEMON_JAVA_OPTS": os.environ.get("INGEST_DEV_JAVA_OPTIONS", ""),
        }
    )
    return env


class _Daemon(ManagedProcess):
    """One JVM of the cluster (a master or a worker), listening on ``port``."""

    kind = "spark-daemon"
    log_name = "daemon.log"
    dir_prefix = "ingest-spark-daemon-"
    probe_interval_s = 0.2

    def __init__(self, main: str, args: list[str], port: int, base_dir: Path) -> None:
        super().__init__(base_dir)
        self._main = main
        self._args = args
        self.port = port

    def start(self) -> Self:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(_spark_home() / "bin" / "spark-class"), self._main, *self._args]
        self._run_start(lambda: self._spawn(cmd, START_TIMEOUT_S, env=_env(self.base_dir)))
        return self

    def stop(self) -> None:
        self._halt(crash=False, timeout=STOP_TIMEOUT_S)
        self._close_log()

    def _ready_probe(self) -> Callable[[], bool]:
        return lambda: port_open(self.port)

    def _not_ready(self) -> str:
        return f"listen on port {self.port}"


class LocalSparkCluster:
    """A master on a free loopback port and its workers, each ``cores`` cores and ``memory``."""

    def __init__(self, base_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.base_dir = base_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self._daemons: list[_Daemon] = []
        self.start_seconds = 0.0

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self) -> Self:
        started = time.monotonic()
        master = _Daemon(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port())],
            self.port,
            self.base_dir / "master",
        )
        self._daemons.append(master.start())
        for n in range(self.workers):
            port = free_port()
            work = self.base_dir / f"worker-{n}"
            args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())]
            args += ["--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work / "work")]
            worker = _Daemon("org.apache.spark.deploy.worker.Worker", [*args, self.master_url], port, work)
            self._daemons.append(worker.start())
        wait_until(self._registered, START_TIMEOUT_S, f"{self.workers} worker(s) registered with the master")
        self.start_seconds = time.monotonic() - started
        return self

    @property
    def pids(self) -> list[int]:
        """The daemons' pids (a worker's executors are its children)."""
        return [d.pid for d in self._daemons if d.pid is not None]

    def _registered(self) -> bool:
        log = (self.base_dir / "master" / "daemon.log").read_text(errors="replace")
        return log.count("Registering worker") >= self.workers

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            daemon.stop()
        self._daemons.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
