"""An ``ingest`` command (a worker, a table committer) as a child process: the one wrapper the
acceptance tests, the chaos run, the benchmark and the demo start them with.

Built on :class:`ingest_dev.process.ManagedProcess`: the command runs in a process group of its
own (a stop that times out kills it together with its Spark JVM), its output goes to
``log_dir/NAME.log`` (JSON events once the command configured logging), and a log of that
name already there is refused: a second process of one name would mix its events into the
first one's log, which is read for results.

Faults a test injects reach the Python process only (:meth:`IngestProcess.signal`,
:meth:`IngestProcess.kill`), as a crash of the worker would: its Spark JVM notices on its own.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

from ingest.logs import STACK_DUMP_SIGNAL
from ingest_dev.process import ManagedProcess, log_tail

REPO = Path(__file__).resolve().parents[1]
# How a stack dump's threads begin (Python's faulthandler), and how long one is given.
_THREAD = ("Thread 0x", "Current thread 0x")
STACK_DUMP_WAIT_S = 1.0


class IngestProcess(ManagedProcess):
    """``python -m ingest ARGS`` with ``env``, from ``cwd`` (the checkout by default).

    Invariant: ``_popen`` is the last process started (kept after a stop for its exit code
    and pid); ``_proc`` (the base class's) is it while it may still run.
    """

    kind: ClassVar[str] = "ingest"
    # What ``python -m`` runs: a wrapper with ingest's command line (bench/profiling/agent.py) may stand in.
    module: ClassVar[str] = "ingest"
    dir_prefix: ClassVar[str] = "ingest-process-"
    # Every process started and not stopped yet, for :func:`kill_leftovers` (the chaos run
    # starts and stops them from several threads).
    _running: ClassVar[set[IngestProcess]] = set()
    _running_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str], log_dir: Path, name: str, *, cwd: Path = REPO
    ) -> None:
        super().__init__(base_dir=log_dir)
        self.name = name
        self._args = list(args)
        self._env = dict(env)
        self._cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        #: When the process was started (epoch seconds, to compare with its log's timestamps).
        self.started_at = 0.0

    @classmethod
    def worker(cls, env: Mapping[str, str], source: str, log_dir: Path, name: str) -> IngestProcess:
        """``ingest worker SOURCE``, started."""
        return cls(["worker", source], env, log_dir, name).start()

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> Self:
        """Start the command. Raises FileExistsError, starting nothing, if the log exists."""
        if self.log_path.exists():
            raise FileExistsError(f"{self.log_path} exists: another process of this name logged there")
        self.started_at = time.time()
        cmd = [sys.executable, "-m", self.module, *self._args]
        self._run_start(lambda: self._spawn(cmd, 30.0, cwd=self._cwd, env=self._env))
        self._popen = self._proc
        with IngestProcess._running_lock:
            IngestProcess._running.add(self)
        return self

    def _halt(self, crash: bool, timeout: float) -> None:
        super()._halt(crash, timeout)
        with IngestProcess._running_lock:
            IngestProcess._running.discard(self)

    def _ready_probe(self) -> Callable[[], bool]:
        # Started is all a caller waits for here; what the command does next is in its log.
        return lambda: True

    def poll(self) -> int | None:
        """The exit code, or None while it runs (or was never started)."""
        return self._popen.poll() if self._popen is not None else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the command's process (not its group)."""
        if self._popen is not None and self._popen.poll() is None:
            self._popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the command's process (a crash), and wait for it."""
        self.signal(signal.SIGKILL)
        if self._popen is not None:
            self._popen.wait(30)
        self._halt(crash=False, timeout=0.0)

    def stop(self, timeout: float = 90.0) -> None:
        """SIGTERM (a worker publishes what it holds, bounded) and wait; :meth:`poll` then
        gives the exit code. One still running after ``timeout`` dumps its threads' stacks into
        its log (:meth:`stacks`), is killed with its group (its Spark JVM too), then
        TimeoutExpired raised: not stopping in time is a failure."""
        proc = self._popen
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(STACK_DUMP_SIGNAL)
                time.sleep(STACK_DUMP_WAIT_S)
                self._halt(crash=True, timeout=0.0)
                raise
        self._halt(crash=False, timeout=0.0)

    def stacks(self) -> list[str]:
        """The threads' stacks its log holds (ingest.logs.install_stack_dumps: the dump a
        stop that timed out asked for), or none."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        first = next((i for i, line in enumerate(lines) if line.startswith(_THREAD)), len(lines))
        return [line for line in lines[first:] if line.startswith((*_THREAD, "  File "))]

    def events(self, name: str | None = None) -> Iterator[dict[str, Any]]:
        """The JSON events logged so far (Spark's and the JVM's plain lines are skipped)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written
            if name is None or event.get("event") == name:
                yield event

    def has_event(self, name: str, **fields: Any) -> bool:
        return any(all(e.get(k) == v for k, v in fields.items()) for e in self.events(name))

    def log_tail(self, max_bytes: int = 4000) -> str:
        return log_tail(self.log_path, max_bytes)


def stop_all(processes: Sequence[IngestProcess], timeout: float = 90.0) -> None:
    """SIGTERM every process at once (their drains overlap), then stop each within ``timeout``
    overall; one that does not stop in time is killed with its group."""
    for process in processes:
        process.signal(signal.SIGCONT)  # a frozen one must run to stop
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.stop(timeout=max(1.0, deadline - time.monotonic()))


def kill_leftovers() -> list[str]:
    """SIGKILL every process group still running that an IngestProcess of this process started
    (a test that failed half-way skipped its stops); returns their names."""
    with IngestProcess._running_lock:
        leftovers = sorted(IngestProcess._running, key=lambda p: p.name)
    for process in leftovers:
        process._halt(crash=True, timeout=0.0)
    return [process.name for process in leftovers]
