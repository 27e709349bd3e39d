"""Inside a profiled worker: where each CPU second of its Python threads goes.

    BENCH_PROFILE_DIR=DIR python -m bench.profiling.agent worker SOURCE    # as ``python -m ingest``

Runs ``ingest``'s command line with a sampling thread beside it. Every ``BENCH_PROFILE_INTERVAL_MS``
(default 10) it reads each Python thread's own CPU clock (the kernel's per-thread clock: exact,
not a tick count) and charges the CPU that thread used since the last sample to the stack it is in now
(``sys._current_frames``): *self* to the innermost function, *inclusive* to every function on
the stack once. A thread blocked in C with the GIL released (``poll()``, a socket read) used no
CPU and is charged nothing. Time in Python's garbage collector is measured per thread by
``gc.callbacks``. The sampler's own CPU is reported as such.

The bench asks for a snapshot of the cumulative figures by creating ``DIR/mark-NAME``; the agent
answers with ``DIR/snap-NAME.json`` (bench/profiling/worker.py takes one at the start and one at the end
of the measured span and reports the difference). Linux only (``/proc``, thread CPU clocks).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK")
SITE = "site-packages/"
STDLIB = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
# CPU of a thread while any frame of these packages is on its stack (the calls into them).
STACK_CATEGORIES = {"py4j": "py4j/", "pyarrow": "pyarrow/", "pyspark": "pyspark/"}


_KEYS: dict[CodeType, str] = {}


def function_key(frame: FrameType) -> str:
    """``module/path.py:qualname``: site-packages paths from the package on, others as given
    relative to the working directory (the checkout). Cached per code object: the sampler walks
    every stack on every sample."""
    code = frame.f_code
    key = _KEYS.get(code)
    if key is None:
        key = _KEYS[code] = _key_of(code)
    return key


def _key_of(code: CodeType) -> str:
    path = code.co_filename
    if SITE in path:
        path = path[path.rindex(SITE) + len(SITE) :]
    elif path.startswith(STDLIB):
        path = path[len(STDLIB) :]
    else:
        path = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path}:{code.co_qualname}"


def thread_cpu_clock(tid: int) -> int:
    """The CPU-time clock of kernel thread ``tid``, as Linux encodes it (glibc's
    ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``). Not ``time.pthread_getcpuclockid``: that
    reads the thread's pthread structure, which is freed once a thread ends, and a thread may
    end between ``threading.enumerate()`` and the call (the worker crashed with SIGSEGV);
    a clock of an ended thread only makes ``clock_gettime`` fail."""
    return ((~tid) << 3) | 6


def process_cpu_s() -> float:
    raw = Path("/proc/self/stat").read_text()
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class ThreadProfiler:
    """The sampling thread. Cumulative figures only; a snapshot is a copy of them."""

    def __init__(self, interval_s: float, control: Path) -> None:
        self.interval_s = interval_s
        self.control = control
        self._last: dict[tuple[int, int], float] = {}
        self.thread_cpu: dict[str, float] = defaultdict(float)
        self.self_cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.inclusive_cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.gc_cpu: dict[str, float] = defaultdict(float)
        self.stack_cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.samples = 0
        self.errors = 0
        self._gc_started = threading.local()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="bench-profiler", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (the worker's profiler runs until the process ends; a test's must not)."""
        self._stopped.set()
        self._thread.join()
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started.at = time.thread_time()
        elif phase == "stop" and getattr(self._gc_started, "at", None) is not None:
            used = time.thread_time() - self._gc_started.at
            self._gc_started.at = None
            # No lock here: a collection may run inside sample() (which holds it) on the
            # sampler's own thread. Each thread adds to its own key only, under the GIL.
            self.gc_cpu[threading.current_thread().name] += used

    def _cpu(self, thread: threading.Thread) -> float | None:
        if thread.native_id is None:
            return None
        try:
            return time.clock_gettime(thread_cpu_clock(thread.native_id))
        except OSError:
            return None  # the thread ended between enumerate() and here

    def sample(self) -> None:
        frames = sys._current_frames()
        with self._lock:
            self.samples += 1
            for thread in threading.enumerate():
                ident = thread.ident
                if ident is None:
                    continue
                cpu = self._cpu(thread)
                if cpu is None:
                    continue
                clock_key = (ident, thread.native_id or 0)
                used = cpu - self._last.get(clock_key, 0.0)
                self._last[clock_key] = cpu
                if used <= 0:
                    continue
                self.thread_cpu[thread.name] += used
                frame = frames.get(ident)
                if frame is None or thread is self._thread:
                    continue
                self.self_cpu[thread.name][function_key(frame)] += used
                seen: set[str] = set()
                walk: FrameType | None = frame
                while walk is not None:
                    key = function_key(walk)
                    if key not in seen:
                        seen.add(key)
                        self.inclusive_cpu[thread.name][key] += used
                    walk = walk.f_back
                for category, prefix in STACK_CATEGORIES.items():
                    if any(k.startswith(prefix) for k in seen):
                        self.stack_cpu[thread.name][category] += used

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "at": time.time(),
                "process_cpu_s": process_cpu_s(),
                "samples": self.samples,
                "errors": self.errors,
                "interval_s": self.interval_s,
                "threads": dict(self.thread_cpu),
                "gc": dict(self.gc_cpu),
                "stack": {t: dict(c) for t, c in self.stack_cpu.items()},
                "self": {t: dict(f) for t, f in self.self_cpu.items()},
                "inclusive": {t: dict(f) for t, f in self.inclusive_cpu.items()},
                "profiler_thread": self._thread.name,
            }

    def _answer_marks(self) -> None:
        for mark in self.control.glob("mark-*"):
            name = mark.name.removeprefix("mark-")
            self.sample()
            tmp = self.control / f"snap-{name}.tmp"
            tmp.write_text(json.dumps(self.snapshot()))
            tmp.replace(self.control / f"snap-{name}.json")
            mark.unlink()

    def _run(self) -> None:
        next_check = 0.0
        while not self._stopped.is_set():
            try:
                self.sample()
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.1
                    self._answer_marks()
            except Exception:
                # A profiler must not stop profiling (nor the worker) over one bad sample; the
                # failure goes to the worker's output, counted.
                self.errors += 1
                if self.errors <= 3:
                    traceback.print_exc()
            self._stopped.wait(self.interval_s)


def main() -> None:
    control = Path(os.environ["BENCH_PROFILE_DIR"])
    interval = float(os.environ.get("BENCH_PROFILE_INTERVAL_MS", "10")) / 1000
    ThreadProfiler(interval, control).start()
    from ingest.cli import exit_process
    from ingest.cli import main as ingest_main

    exit_process(ingest_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
