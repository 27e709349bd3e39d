"""A local or standalone driver's session (ingest.spark.session.FixedSession) after a failed
build: kept while its JVM runs; once the JVM this process launched has exited, every later
build raises SparkDriverExited (the role exits and is restarted) and stop() leaves the dead JVM
alone. Fakes stand in for pyspark's session; tests/acceptance/test_driver_exit.py kills a real
worker's JVM."""

from __future__ import annotations

from typing import Any

import pytest
from py4j.protocol import Py4JNetworkError

from ingest.errors import SparkDriverExited, WorkerFailed
from ingest.spark.session import FixedSession, driver_exit_status
from ingest.spark.start import session_source


class Process:
    def __init__(self) -> None:
        self.status: int | None = None

    def poll(self) -> int | None:
        return self.status


class Session:
    def __init__(self) -> None:
        self.process = Process()
        self.stopped = False
        gateway = type("Gateway", (), {"proc": self.process})()
        self.sparkContext = type("Context", (), {"_gateway": gateway})()

    def stop(self) -> None:
        self.stopped = True


def test_a_failure_while_the_jvm_runs_keeps_the_session() -> None:
    session = Session()
    owner = FixedSession(session)
    owner.failed(session, RuntimeError("a job's own error"))
    assert owner.current() is session and owner.peek() is session
    owner.stop()
    assert session.stopped


def test_once_the_jvm_exited_every_build_raises_and_stop_leaves_it_alone() -> None:
    session = Session()
    owner = FixedSession(session)
    session.process.status = -9  # SIGKILLed
    owner.failed(session, Py4JNetworkError("Answer from Java side is empty"))
    with pytest.raises(SparkDriverExited, match=r"the Spark driver JVM exited \(status -9\): Py4JNetworkError") as info:
        owner.current()
    assert isinstance(info.value, WorkerFailed) and info.value.exit_status == -9
    assert owner.peek() is None
    owner.stop()
    assert not session.stopped


def test_a_session_without_a_launched_jvm_has_no_exit_status() -> None:
    assert driver_exit_status(object()) is None
    no_process: Any = Session()
    no_process.sparkContext._gateway.proc = None
    assert driver_exit_status(no_process) is None


def test_session_source_keeps_a_local_drivers_session_as_it_is() -> None:
    session = Session()
    owner = session_source("local[2]", "ingest-x", session, retry_s=1.0)
    assert isinstance(owner, FixedSession) and owner.current() is session
