"""Every server and worker the tests, the demo and the benchmark start dies with the process that
started it, SIGKILL included (``ingest_dev.process.popen``): a process that starts one of each
kind of launch is SIGKILLed, and nothing it started, nor anything those started, is left.

The kinds: a plain exec (moto's S3 server; LocalKafka and LocalSchemaRegistry exec their JVM
the same way), a server run as the ``postgres`` user with children of its own (PostgreSQL and
its backends, one of them serving a connection this test holds open), a JVM behind exec'ing
launch scripts (the Spark Connect server: ``spark-submit`` execs ``spark-class``, which execs
``java``), and a Python process started as a worker is (IngestProcess) that holds a Spark
session, its JVM a child of its own (pyspark's launch through ``spark-submit``).

Run as ``python -m tests.integration.test_process_lifeline parent DIR`` it is that process;
with ``spark`` it is the Python process holding a Spark session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import psycopg
import pytest

from ingest_dev.ingest_process import REPO, IngestProcess
from ingest_dev.process import popen
from ingest_dev.testkit import java_under, wait_until

pytestmark = pytest.mark.timeout(240)


class SparkHolder(IngestProcess):
    """This module's ``spark`` role, started the way a worker is."""

    module: ClassVar[str] = "tests.integration.test_process_lifeline"


def _hold_a_spark_session() -> None:
    from pyspark.sql import SparkSession

    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    print("spark_session_started", flush=True)
    time.sleep(3600)


def _start_one_of_each(out: Path) -> None:
    from ingest_dev.postgres import LocalPostgres
    from ingest_dev.s3 import LocalS3
    from ingest_dev.spark_connect import LocalConnectServer

    spark = SparkHolder(["spark"], os.environ, out, "spark").start()
    postgres = LocalPostgres().start()
    s3 = LocalS3().start()
    connect = LocalConnectServer().start()
    assert spark.pid is not None
    wait_until(lambda: java_under(spark.pid or 0), 120, "the Spark session's JVM", detail=spark.log_tail)
    servers = {"spark": spark.pid, "postgres": postgres.pid, "s3": s3.pid, "connect": connect.pid}
    dirs = [str(server.base_dir) for server in (postgres, s3, connect)]
    (out / "started.json.tmp").write_text(json.dumps({"pids": servers, "dirs": dirs, "postgres": postgres.url}))
    (out / "started.json.tmp").rename(out / "started.json")
    time.sleep(3600)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a live process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19]), fields[0]


def _tree(root: int) -> dict[int, int]:
    """``root`` and every descendant, each with its start time (which tells a reused pid apart)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents.setdefault(stat[0], []).append(int(entry))
            starts[int(entry)] = stat[1]
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            tree[pid] = starts[pid]
            todo += parents.get(pid, [])
    return tree


def _alive(pid: int, started: int) -> bool:
    stat = _stat(pid)
    # A zombie has exited (its new parent has not reaped it yet); another start time: a reused pid.
    return stat is not None and stat[1] == started and stat[2] != "Z"


def test_every_server_and_worker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    parent = popen(
        [sys.executable, "-m", SparkHolder.module, "parent", str(tmp_path)],
        cwd=REPO,
        stdout=(tmp_path / "parent.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    started: dict[str, object] = {}
    trees: dict[str, dict[int, int]] = {}
    try:

        def up() -> bool:
            assert parent.poll() is None, (tmp_path / "parent.log").read_text()[-3000:]
            return (tmp_path / "started.json").exists()

        wait_until(up, 180, "the servers to start", interval=0.2)
        started = json.loads((tmp_path / "started.json").read_text())
        pids: dict[str, int] = started["pids"]  # type: ignore[assignment]
        with psycopg.connect(str(started["postgres"]), autocommit=True) as held:
            backend = held.execute("SELECT pg_backend_pid()").fetchone()
            trees = {name: _tree(pid) for name, pid in pids.items()}
            assert backend is not None and backend[0] in trees["postgres"]  # a backend serving this test
            assert java_under(pids["spark"]) in trees["spark"]
            assert all(_stat(pid) is not None for pid in pids.values())

            parent.kill()
            parent.wait(10)
            killed = time.monotonic()

            def left() -> dict[str, list[int]]:
                return {
                    name: alive
                    for name, tree in trees.items()
                    if (alive := [pid for pid, start in tree.items() if _alive(pid, start)])
                }

            wait_until(lambda: not left(), 15, "every server and its children to exit", detail=lambda: str(left()))
        print(f"all gone {time.monotonic() - killed:.1f} s after the SIGKILL: {trees}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        parent.wait(10)
        for tree in trees.values():  # what survived a failure: ended here, by pid
            for pid, start in tree.items():
                if _alive(pid, start):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for directory in started.get("dirs", []):  # type: ignore[attr-defined]
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "spark":
        _hold_a_spark_session()
    else:
        _start_one_of_each(Path(sys.argv[2]))
