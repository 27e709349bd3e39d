"""A local Spark Connect server: the one the pyspark wheel ships (the ``spark-connect`` jar is
in ``pyspark/jars``), started on a free loopback port through ``sbin/spark-daemon.sh submit``
as Spark's ``start-connect-server.sh`` does (the pyspark 4.1 wheel ships spark-daemon.sh, not
that script). It needs no network beyond loopback. Its pid file and log live in a temp dir,
so :meth:`LocalConnectServer.stop` stops exactly the server it started.

Used by the tests' ``spark_connect`` fixture, the chaos run (``--spark connect``) and
``python -m bench.fleet``. The server runs on this machine, so the workers' staging and
segment directories (plain local paths) are readable and writable by it, as a shared volume
would be in production.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ingest_dev.testkit import free_port, port_open, wait_until

# Under load (2 shared cores) the server has taken ~40 s to start; it is usually ~5-10 s.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class LocalConnectServer:
    """The pyspark wheel's Connect server, on 127.0.0.1: ``master`` is its own Spark master
    (``local[N]``: the executors are threads of the server's JVM)."""

    def __init__(self, driver_memory: str = "768m", master: str = "local[1]") -> None:
        import pyspark

        self.spark_home = Path(pyspark.__file__).resolve().parent
        self.dir = Path(tempfile.mkdtemp(prefix="ingest-spark-connect-"))
        self.port = free_port()
        self.driver_memory = driver_memory
        self.master = master
        self.pid: int | None = None
        self.start_seconds = 0.0

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            {
                "SPARK_HOME": str(self.spark_home),
                "SPARK_IDENT_STRING": f"ingest-test-{self.port}",
                "SPARK_PID_DIR": str(self.dir),
                "SPARK_LOG_DIR": str(self.dir),
                "SPARK_LOCAL_IP": "127.0.0.1",
            }
        )
        return env

    def log_tail(self, lines: int = 40) -> str:
        text = "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.out")))
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> LocalConnectServer:
        script = self.spark_home / "sbin" / "spark-daemon.sh"
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.local.dir": str(self.dir / "local"),
        }
        args = ["bash", str(script), "submit", SERVER_CLASS, "1", "--name", "Spark Connect server"]
        args += ["--master", self.master, "--driver-memory", self.driver_memory]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        started = time.monotonic()
        # spark-daemon.sh daemonizes the JVM (nohup) and returns once it runs; the pid file names it.
        subprocess.run(args, env=self._env(), check=True, timeout=60, capture_output=True)
        pid_files = list(self.dir.glob("*.pid"))
        if not pid_files:
            raise RuntimeError(f"spark-daemon.sh wrote no pid file in {self.dir}")
        self.pid = int(pid_files[0].read_text().strip())
        pid = self.pid

        def listening() -> bool:
            if not pid_alive(pid):
                raise RuntimeError(f"the Spark Connect server exited during start:\n{self.log_tail()}")
            return port_open(self.port)

        try:
            wait_until(listening, START_TIMEOUT_S - (time.monotonic() - started), "the Spark Connect server to listen")
        except TimeoutError:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"the Spark Connect server did not listen within {START_TIMEOUT_S}s:\n{tail}") from None
        self.start_seconds = time.monotonic() - started
        return self

    def kill(self) -> None:
        """SIGKILL the server and wait until it is gone; :meth:`start` starts a new one on the
        same port, which knows none of the old one's sessions."""
        self._end(signal.SIGKILL)

    def crash_and_restart(self) -> float:
        """SIGKILL the server, then start a new one on the same port (the chaos run's ``spark``
        fault under Connect: every client's session is gone with it). Returns the seconds the
        port was without a server."""
        started = time.monotonic()
        self.kill()
        self.start()
        return time.monotonic() - started

    def stop(self) -> None:
        self._end(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _end(self, sig: int) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        # Not our child: init reaps it.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not pid_alive(pid), STOP_TIMEOUT_S, "the Spark Connect server to exit", interval=0.2)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
