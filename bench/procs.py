"""Child processes of the bench and what they cost: CPU seconds and RSS of whole process trees.

Read straight from ``/proc`` (Linux only, like the rest of the bench): psutil is not a
dependency of the project, and /proc gives the same numbers.  A worker's tree includes the
Spark JVM that pyspark launches as its child.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ingest_dev.ingest_process import IngestProcess
from ingest_dev.process import popen

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    cpu_s: float
    rss_bytes: int
    comm: str = ""


def read_stat(pid: int) -> ProcStat | None:
    """ppid, user+system CPU seconds and RSS of one process (all its threads); None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15, rss 24 (in pages).
    return ProcStat(
        ppid=int(rest[1]),
        cpu_s=(int(rest[11]) + int(rest[12])) / _CLK_TCK,
        rss_bytes=int(rest[21]) * _PAGE,
        comm=raw[raw.find("(") + 1 : raw.rfind(")")],
    )


def tree_rss_bytes(tree: dict[int, ProcStat], root: int) -> int:
    """RSS of a process tree, without the children that have not yet exec'd (same command name
    as their parent). The JVM starts programs (Hadoop's local file system runs chmod) through a
    child that shares its address space until exec: /proc reports that child's RSS as the
    whole JVM's, and a sample that caught one counted the JVM twice (a 10M-record run's worker
    showed 5.1 GB for 3.2 GB)."""
    return sum(
        st.rss_bytes for pid, st in tree.items() if pid == root or st.ppid not in tree or tree[st.ppid].comm != st.comm
    )


def process_tree(roots: Sequence[int]) -> dict[int, ProcStat]:
    """Every live process descending from ``roots`` (roots included), with its stats."""
    stats: dict[int, ProcStat] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    tree: dict[int, ProcStat] = {}
    todo = [r for r in roots if r in stats]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree[pid] = stats[pid]
        todo.extend(children.get(pid, []))
    return tree


@dataclass
class Sample:
    at: float  # wall clock (time.time()), the same clock as the workers' log timestamps
    cpu_s: float  # cumulative CPU of every process ever seen in the trees (exited ones keep their last value)
    rss_bytes: int  # sum of RSS of the live processes
    rss_by_root: dict[int, int]
    # Each root process's own CPU seconds (its children's not included): a worker's Python.
    own_cpu_by_root: dict[int, float]


class TreeSampler:
    """Samples the CPU and RSS of the process trees under some root pids, in a thread.

    CPU is cumulative per pid: a process that exits keeps the last value seen, so a window's
    CPU is ``cpu_at(end) - cpu_at(start)`` (linear between samples).
    """

    def __init__(self, interval: float = 0.2) -> None:
        self._interval = interval
        self._roots: list[int] = []
        self._last_cpu: dict[int, float] = {}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def add_root(self, pid: int) -> None:
        with self._lock:
            self._roots.append(pid)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # A sampler that is only sampled by hand (``sample()``) never started its thread.
        if self._thread.ident is not None:
            self._thread.join(timeout=10)

    def sample(self) -> Sample:
        with self._lock:
            roots = list(self._roots)
            rss_by_root: dict[int, int] = {}
            own_cpu: dict[int, float] = {}
            total_rss = 0
            for root in roots:
                tree = process_tree([root])
                if root in tree:
                    own_cpu[root] = tree[root].cpu_s
                for pid, st in tree.items():
                    self._last_cpu[pid] = st.cpu_s
                rss = tree_rss_bytes(tree, root)
                rss_by_root[root] = rss
                total_rss += rss
            s = Sample(
                at=time.time(),
                cpu_s=sum(self._last_cpu.values()),
                rss_bytes=total_rss,
                rss_by_root=rss_by_root,
                own_cpu_by_root=own_cpu,
            )
            self.samples.append(s)
            return s

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)

    def cpu_at(self, at: float) -> float:
        """Cumulative CPU seconds at wall time ``at``, interpolated between samples."""
        samples = list(self.samples)
        if not samples:
            return 0.0
        if at <= samples[0].at:
            return samples[0].cpu_s
        for a, b in itertools.pairwise(samples):
            if a.at <= at <= b.at:
                frac = (at - a.at) / (b.at - a.at) if b.at > a.at else 1.0
                return a.cpu_s + frac * (b.cpu_s - a.cpu_s)
        return samples[-1].cpu_s

    def own_cpu_between(self, roots: Sequence[int], start: float, end: float) -> float:
        """CPU seconds the ``roots`` processes themselves (not their children) used between the
        last samples at or before ``start`` and ``end``."""

        def at(when: float) -> dict[int, float]:
            seen: dict[int, float] = {}
            for sample in self.samples:
                if sample.at > when and seen:
                    break
                seen.update(sample.own_cpu_by_root)
            return seen

        first, last = at(start), at(end)
        return sum(last.get(pid, 0.0) - first.get(pid, 0.0) for pid in roots)

    def peak_rss_bytes(self) -> int:
        return max((s.rss_bytes for s in self.samples), default=0)

    def peak_rss_by_root(self) -> dict[int, int]:
        peaks: dict[int, int] = {}
        for s in self.samples:
            for root, rss in s.rss_by_root.items():
                peaks[root] = max(peaks.get(root, 0), rss)
        return peaks


class BusyLoops:
    """``n`` processes spinning on a CPU each, for at most ``limit_s`` seconds (they end by
    themselves even if the bench dies), while the block runs."""

    def __init__(self, n: int, limit_s: float) -> None:
        self.n = n
        self.limit_s = limit_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        code = f"import time\nend = time.monotonic() + {self.limit_s}\nwhile time.monotonic() < end: pass"
        self.procs = [popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


# --------------------------------------------------------------------------- worker processes


def parse_log_time(value: str) -> float:
    """structlog's ISO-8601 UTC timestamp (``...Z``) as epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class WorkerProcess(IngestProcess):
    """``python -m ingest worker SOURCE`` with its metrics port and worker id set: an
    IngestProcess (its own process group, so the JVM dies with it; its JSON log in a file of
    its own, never shared) whose /metrics the benchmark reads."""

    def __init__(
        self, name: str, source: str, env: dict[str, str], log_dir: Path, metrics_port: int, cwd: Path
    ) -> None:
        env = {**env, "INGEST_METRICS_PORT": str(metrics_port), "INGEST_WORKER_ID": name}
        super().__init__(["worker", source], env, log_dir, name, cwd=cwd)
        self.source = source
        self.metrics_port = metrics_port

    def metrics(self) -> dict[str, float]:
        """This worker's /metrics, as ``{name{labels}: value}`` (empty if it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=3) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        return parse_prometheus(text)


def parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def metric(values: dict[str, float], name: str) -> float:
    """Sum of every series of ``name`` (whatever its labels)."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))
