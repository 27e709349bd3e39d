"""ManagedProcess, the base of the local servers and of IngestProcess: readiness deadline, log
capture, port retries, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import pytest

from ingest import cli
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.process import ManagedProcess
from ingest_dev.testkit import wait_until


class Script(ManagedProcess):
    """A Python one-liner as the server; ready once ``ready`` exists in its directory."""

    kind = "script"
    log_name = "script.log"
    dir_prefix = "ingest-test-proc-"
    probe_interval_s = 0.01

    def __init__(self, code: str, base_dir: Path | None = None, ready_timeout: float = 5.0) -> None:
        super().__init__(base_dir)
        self.code = code
        self.ready_timeout = ready_timeout
        self.launches = 0

    def start(self) -> Self:
        def launch() -> None:
            self.launches += 1
            self._spawn([sys.executable, "-c", self.code], self.ready_timeout)

        self._run_start(lambda: self._retry_on_free_ports(launch, lambda: "-", attempts=3))
        return self

    def stop(self) -> None:
        self._halt(crash=False, timeout=5.0)
        self._cleanup()

    def _ready_probe(self) -> Callable[[], bool]:
        return lambda: (self.base_dir / "ready").exists()


SERVE = "import pathlib, time; print('serving', flush=True); pathlib.Path('ready').touch(); time.sleep(60)"


def test_start_waits_until_ready_logs_output_and_stop_removes_its_directory() -> None:
    with Script(SERVE) as proc:
        assert proc.is_running() and proc.pid is not None
        base = proc.base_dir
        assert "serving" in proc.log_path.read_text()
    assert not proc.is_running()
    assert not base.exists()


def test_a_given_directory_is_kept(tmp_path: Path) -> None:
    with Script(SERVE, base_dir=tmp_path) as proc:
        pass
    assert not proc.is_running()
    assert (tmp_path / "script.log").is_file()


def test_an_early_exit_reports_the_log_tail_and_cleans_up() -> None:
    proc = Script("print('bad config'); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"script exited with code 3 during startup(.|\n)*bad config"):
        proc.start()
    assert proc.launches == 1
    assert proc._base_dir is None  # its own temporary directory is gone


def test_address_in_use_is_retried_on_fresh_ports() -> None:
    proc = Script("print('Address already in use'); raise SystemExit(1)")
    with pytest.raises(RuntimeError, match="could not find a free port for script after 3 attempts"):
        proc.start()
    assert proc.launches == 3


def test_a_server_not_ready_by_the_deadline_is_killed() -> None:
    # The deadline leaves a loaded machine time to start Python and print (the message quotes it).
    proc = Script("import time; print('slow', flush=True); time.sleep(60)", ready_timeout=5.0)
    with pytest.raises(TimeoutError, match=r"script did not become ready within 5.0 s(.|\n)*slow"):
        proc.start()
    assert not proc.is_running()
    assert proc._base_dir is None


def test_an_ingest_command_runs_in_its_own_group_logs_to_its_file_and_reports_its_exit(tmp_path: Path) -> None:
    proc = IngestProcess(["--version"], dict(os.environ), tmp_path, "version").start()
    assert proc.pid is not None and os.getpgid(proc.pid) == proc.pid
    assert wait_until(lambda: proc.poll() is not None, 60, "ingest --version to exit", interval=0.05)
    proc.stop()
    assert proc.poll() == 0
    assert proc.log_path == tmp_path / "version.log" and proc.log_path.read_text().strip()
    # A second process of the same name would write into this one's log: refused.
    with pytest.raises(FileExistsError):
        IngestProcess(["--version"], dict(os.environ), tmp_path, "version").start()


class Stubborn(IngestProcess):
    """This module as the command: ``ingest``'s entry point running a command that ignores
    SIGTERM (see the end of the file)."""

    module = __name__


def test_an_ingest_command_that_ignores_its_sigterm_dumps_its_stacks_and_is_killed(tmp_path: Path) -> None:
    proc = Stubborn([], dict(os.environ), tmp_path, "stubborn").start()
    assert wait_until(lambda: "waiting" in proc.log_path.read_text(), 60, "the command to start", interval=0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.stop(timeout=0.5)
    assert proc.poll() == -signal.SIGKILL
    stacks = proc.stacks()
    assert stacks[0].startswith("Current thread 0x"), stacks
    assert any("in _ignore_sigterm_and_wait" in line for line in stacks), stacks
    # Only the dump: none of the command's own output.
    assert not any("waiting" in line for line in stacks), stacks


def test_a_server_outlives_the_thread_that_started_it() -> None:
    """The kernel sends a child's parent-death signal when the *thread* that forked it ends:
    every child is forked on one thread that lives as long as the process, so a server started
    from a thread that ends (the chaos run's) keeps running. Its death with the process:
    tests/integration/test_process_lifeline.py."""
    started: list[Script] = []
    thread = threading.Thread(target=lambda: started.append(Script(SERVE).start()))
    thread.start()
    thread.join(10)
    [proc] = started
    try:
        time.sleep(0.2)  # a parent-death signal sent at the thread's end would have landed
        assert proc.is_running()
    finally:
        proc.stop()


def _ignore_sigterm_and_wait() -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("waiting", flush=True)
    time.sleep(120)
    return 0


if __name__ == "__main__":
    # The console script's entry point, with a command that ignores its SIGTERM.
    cli.main = lambda: _ignore_sigterm_and_wait()
    cli.run()
