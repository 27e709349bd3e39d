"""One managed local server process: what LocalPostgres, LocalKafka and LocalS3 share.

:class:`ManagedProcess` owns the lifecycle: a base directory (a temporary one removed on
stop, or the caller's, kept), the server's output appended to a log file in it, launch in
a process group of its own, a readiness probe polled until a deadline (an early exit or an
"address in use" is reported with the log's tail), a clean stop (a signal, then SIGKILL of
the whole group) or a crash (SIGKILL at once), and retries on a fresh port when another
process took the port between :func:`ingest_dev.testkit.free_port` and the server's bind.

Subclasses say how to prepare and launch (:meth:`ManagedProcess._launch`, calling
:meth:`ManagedProcess._spawn`) and how to tell that the server is ready
(:meth:`ManagedProcess._ready_probe`).

Every server and worker dies with the process that started it, however that process ends
(SIGKILL, an OOM kill, a crash of pytest): :func:`popen` starts each one with the kernel's
parent-death signal set to SIGKILL (``prctl(PR_SET_PDEATHSIG)``, in the child after its user
changed, since a change of user clears it). The kernel sends that signal when the *thread*
that forked the child ends, not the process, so every child is forked by one thread that lives
as long as the process (:class:`_Forker`). What a server starts itself goes with it: a
PostgreSQL backend exits when its postmaster dies, a worker's Spark JVM when its stdin (the
worker's pipe) closes; a JVM is exec'd by its launch scripts (``spark-submit`` execs
``java``), so it is the child itself. ``tests/integration/test_process_lifeline.py`` SIGKILLs a
process that started each kind and checks that nothing of them is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Self, TypeVar

from ingest_dev.testkit import wait_until

log = logging.getLogger(__name__)

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when ``parent``'s forking thread ends. Runs in
    the child between fork and exec, after Popen set its user and group."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Forker:
    """The one thread every child is forked on: it lives as long as the process (a daemon
    thread blocked on its queue), so a child's parent-death signal comes with the process's
    death, never with the end of a thread that happened to start it (the chaos run starts and
    stops workers from threads of its own). Started again in a forked copy of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def run(self, job: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), name="ingest-forker", daemon=True
                )
                self._thread.start()
                self._pid = os.getpid()
            jobs, thread = self._jobs, self._thread
        if threading.current_thread() is thread:
            return job()
        done: Future[T] = Future()
        jobs.put((job, done))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:
            job, done = jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # the caller's to handle, in the caller's thread
                done.set_exception(exc)


_FORKER = _Forker()


def popen(cmd: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **popen_kwargs)`` whose child is SIGKILLed by the kernel when this
    process dies, however (see the module docstring): how every server, worker and other
    long-running child of the tests, the demo and the benchmark is started."""
    preexec = _die_with_parent(os.getpid())
    return _FORKER.run(lambda: subprocess.Popen(cmd, preexec_fn=preexec, **popen_kwargs))


def run_process(
    cmd: Sequence[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **popen_kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` over :func:`popen`: the command dies with this process too. For the
    commands that run long or start servers and JVMs (a benchmark, a Spark session); a tool
    that answers at once needs no lifeline."""
    if capture_output:
        popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    with popen(cmd, **popen_kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            exc.stdout, exc.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
    code = proc.poll()
    assert code is not None
    if check and code:
        raise subprocess.CalledProcessError(code, cmd, stdout, stderr)
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def log_tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"


def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig`` to the process, wait up to ``timeout``, then SIGKILL its process group."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored signal %d for %.1f s; killing its process group", proc.pid, sig, timeout)
        kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Every server is started in its own process group (process_group=0), so the group
    # id is the pid.  Killing the whole group matters for PostgreSQL: orphaned backends
    # would keep the shared memory segment attached and block the next start.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


class PortInUse(RuntimeError):
    """The server exited at startup because its port was taken: retry on a fresh one."""


class ManagedProcess:
    """A server process in its own process group, its output in ``base_dir / log_name``.

    Invariants: ``_proc`` is None or a process started by :meth:`_spawn`; ``_log_fh`` is open
    exactly while a process may write to it; a directory this object created (``base_dir``
    None at construction) is removed by :meth:`_cleanup`, a caller's directory never is.
    """

    #: What the server is called in errors ("postgres", "kafka").
    kind: ClassVar[str]
    #: The log file's name in ``base_dir``.
    log_name: ClassVar[str]
    #: The prefix of a temporary ``base_dir``.
    dir_prefix: ClassVar[str]
    #: The signal of a clean stop.
    stop_signal: ClassVar[int] = signal.SIGTERM
    #: Errors of the readiness probe that mean "not ready yet".
    probe_errors: ClassVar[tuple[type[Exception], ...]] = (OSError,)
    #: Seconds between readiness probes.
    probe_interval_s: ClassVar[float] = 0.05

    def __init__(self, base_dir: Path | None = None) -> None:
        self._base_dir = base_dir
        self._owns_dir = base_dir is None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None

    # -- public API

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._base_dir

    @property
    def log_path(self) -> Path:
        return self.base_dir / self.log_name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- for subclasses

    def _ready_probe(self) -> Callable[[], bool]:
        """A call that answers True once the server serves; it may raise :attr:`probe_errors`."""
        raise NotImplementedError

    def _port_in_use(self, tail: str) -> bool:
        """Whether the log's tail says the server could not bind its port."""
        return "Address already in use" in tail

    def _not_ready(self) -> str:
        """What the server did not do in time, for the TimeoutError ("accept connections on ...")."""
        return "become ready"

    def _run_start(self, launch: Callable[[], None]) -> None:
        """Create the base directory if needed and run ``launch``; on failure close the log and
        remove a directory this object owns."""
        if self._base_dir is None:
            # Short path under /tmp: a Unix socket path in it must stay below ~107 bytes.
            self._base_dir = Path(tempfile.mkdtemp(prefix=self.dir_prefix))
        self._base_dir.mkdir(parents=True, exist_ok=True)
        try:
            launch()
        except BaseException:
            self._close_log()
            if self._owns_dir:
                self._remove_dir()
            raise

    def _retry_on_free_ports(self, launch: Callable[[], None], pick: Callable[[], str], attempts: int = 5) -> None:
        """Call ``pick`` (choose fresh ports, return them for the log) then ``launch``, again
        while the launch fails with :class:`PortInUse`."""
        for attempt in range(attempts):
            ports = pick()
            try:
                launch()
                return
            except PortInUse:
                # Lost the race between free_port() and bind: another process took it.
                log.info("port %s taken before %s bound it (attempt %d); retrying", ports, self.kind, attempt + 1)
        raise RuntimeError(f"could not find a free port for {self.kind} after {attempts} attempts")

    def _spawn(self, cmd: list[str], ready_timeout: float, *, cwd: Path | None = None, **popen_kwargs: Any) -> None:
        """Start ``cmd`` in ``cwd`` (``base_dir`` by default) with its output appended to the
        log, then wait until ready; a server that is not ready by then is killed with its group."""
        self._close_log()
        self._log_fh = self.log_path.open("ab")
        self._proc = popen(
            cmd,
            cwd=cwd or self.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            # Own process group: a terminal Ctrl-C does not reach the server directly, and
            # a crash kills the server and its children together.
            process_group=0,
            **popen_kwargs,
        )
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            kill_group(self._proc)
            self._proc = None
            raise

    def _wait_ready(self, timeout: float) -> None:
        proc = self._proc
        assert proc is not None
        probe = self._ready_probe()
        last_error: list[Exception] = []

        def ready() -> bool:
            if proc.poll() is not None:
                tail = log_tail(self.log_path)
                if self._port_in_use(tail):
                    raise PortInUse(tail)
                raise RuntimeError(
                    f"{self.kind} exited with code {proc.returncode} during startup;"
                    f" log tail ({self.log_path}):\n{tail}"
                )
            try:
                return probe()
            except self.probe_errors as exc:
                last_error[:] = [exc]
                return False

        try:
            wait_until(ready, timeout, f"{self.kind} to {self._not_ready()}", interval=self.probe_interval_s)
        except TimeoutError:
            raise TimeoutError(
                f"{self.kind} did not {self._not_ready()} within {timeout:.1f} s"
                f" (last error: {last_error[0] if last_error else None}); log tail ({self.log_path}):\n"
                f"{log_tail(self.log_path)}"
            ) from None

    def _halt(self, crash: bool, timeout: float) -> None:
        """Stop the process (``stop_signal``, SIGKILL of the group after ``timeout``; at once
        with ``crash``) and close the log; the directory stays."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if crash:
                kill_group(proc)
            else:
                stop_process(proc, self.stop_signal, timeout)
        self._close_log()

    def _cleanup(self) -> bool:
        """Remove the base directory if this object created it; True if it did."""
        if self._owns_dir:
            self._remove_dir()
            return True
        return False

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _remove_dir(self) -> None:
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None
