"""A local Spark Connect server: the one the pyspark wheel ships (the ``spark-connect`` jar is
in ``pyspark/jars``), started on a free loopback port by ``bin/spark-submit`` in the foreground,
with the arguments Spark's ``start-connect-server.sh`` passes (the pyspark 4.1 wheel does not
ship it), as the compose file's ``spark-connect`` service does. Not through ``spark-daemon.sh``,
which would detach the JVM from this process: ``spark-submit`` execs ``spark-class``, which
execs ``java``, so the server's JVM is the child this process started and dies with it
(:func:`ingest_dev.process.popen`). Its log and local directory live in a temp dir.

Used by the tests' ``spark_connect`` fixture, the chaos run (``--spark connect``) and
``python -m bench.fleet``. It loads the project's pinned jar set (Spark's Kafka source reads
the workers' splits). The server runs on this machine, so the workers' segment directories
(plain local paths) are writable by it, as a shared volume would be in production.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from ingest_dev.process import ManagedProcess, log_tail
from ingest_dev.testkit import free_port, port_open

# Under load (2 shared cores) the server has taken ~40 s to start; it is usually ~5-10 s.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class LocalConnectServer(ManagedProcess):
    """The pyspark wheel's Connect server, on 127.0.0.1: ``master`` is its own Spark master
    (``local[N]``: the executors are threads of the server's JVM). :meth:`kill` and
    :meth:`start` again keep the port (a new server that knows none of the old sessions)."""

    kind = "spark-connect"
    log_name = "connect.log"
    dir_prefix = "ingest-spark-connect-"
    probe_interval_s = 0.2

    def __init__(self, driver_memory: str = "768m", master: str = "local[1]") -> None:
        import pyspark

        super().__init__()
        self.spark_home = Path(pyspark.__file__).resolve().parent
        self.port = free_port()
        self.driver_memory = driver_memory
        self.master = master
        self.start_seconds = 0.0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(log_tail(self.log_path).splitlines()[-lines:])

    def start(self) -> Self:
        if self.is_running():
            raise RuntimeError(f"the Spark Connect server already runs at {self.url}")
        started = time.monotonic()
        self._run_start(lambda: self._spawn(self._command(), START_TIMEOUT_S, env=self._env()))
        self.start_seconds = time.monotonic() - started
        return self

    def kill(self) -> None:
        """SIGKILL the server and wait until it is gone; :meth:`start` starts a new one on the
        same port, which knows none of the old one's sessions."""
        self._halt(crash=True, timeout=0.0)

    def crash_and_restart(self) -> float:
        """SIGKILL the server, then start a new one on the same port (the chaos run's ``spark``
        fault under Connect: every client's session is gone with it). Returns the seconds the
        port was without a server."""
        started = time.monotonic()
        self.kill()
        self.start()
        return time.monotonic() - started

    def stop(self) -> None:
        self._halt(crash=False, timeout=STOP_TIMEOUT_S)
        self._cleanup()

    # -- ManagedProcess

    def _ready_probe(self) -> Callable[[], bool]:
        return lambda: port_open(self.port)

    def _not_ready(self) -> str:
        return f"listen on port {self.port}"

    # -- internals

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update({"SPARK_HOME": str(self.spark_home), "SPARK_LOCAL_IP": "127.0.0.1"})
        return env

    def _command(self) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.local.dir": str(self.base_dir / "local"),
        }
        from ingest.spark.jars import spark_jars
        from ingest.spark.session import jvm_options_args

        cmd = [str(self.spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "Spark Connect server"]
        cmd += ["--master", self.master, "--driver-memory", self.driver_memory]
        # The server's JVM (and any executors of its own) with the Java options of every Spark
        # JVM the project starts: Avro's length limits, without which one poison record's
        # claimed length is an OutOfMemoryError that ends the server (ingest.spark.session).
        cmd += jvm_options_args()
        # The project's jar set, as the compose service has it: the workers' builds read Kafka
        # through Spark's Kafka source, and Avro sources decode with spark-avro.
        cmd += ["--jars", ",".join(str(j) for j in spark_jars())]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd
