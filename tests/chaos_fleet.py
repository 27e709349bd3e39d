"""The chaos run's fleet of worker processes, and its supervisor that restarts the ones that
exit on their own or report themselves unhealthy, as an orchestrator would."""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from ingest_dev.ingest_process import IngestProcess, stop_all
from ingest_dev.testkit import free_port, java_under


def log_since(t0: float, message: str) -> None:
    print(f"[chaos {time.monotonic() - t0:7.1f}s] {message}", flush=True)


class Fleet:
    """Worker processes with metrics ports, and the supervisor that restarts the ones that
    exit on their own or report themselves unhealthy."""

    @property
    def source_name(self) -> str:
        return self._source

    def __init__(self, env: dict[str, str], source: str, log_dir: Path, t0: float) -> None:
        self._env = env
        self._source = source
        self._log_dir = log_dir
        self._t0 = t0
        self._lock = threading.RLock()
        self._seq = 0
        self.live: dict[str, tuple[IngestProcess, int]] = {}
        self.all: list[IngestProcess] = []
        self.frozen: set[str] = set()
        self.unplanned_exits = 0
        self.health_restarts = 0
        self._unhealthy_seen: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    def start(self, n: int) -> None:
        for _ in range(n):
            self.add()
        self._thread.start()

    def add(self) -> str:
        with self._lock:
            name = f"w{self._seq}"
            self._seq += 1
            port = free_port()
            env = {**self._env, "INGEST_METRICS_PORT": str(port), "INGEST_WORKER_ID": f"chaos-{name}"}
            worker = IngestProcess.worker(env, self._source, self._log_dir, name)
            self.live[name] = (worker, port)
            self.all.append(worker)
            return name

    def pick(self, rng: random.Random) -> str | None:
        """A worker to fault: one that owns partitions when there is one (a fault on a worker
        still starting Spark tests nothing of the group)."""
        with self._lock:
            names = sorted(n for n in self.live if n not in self.frozen)
        owners = [n for n in names if self.ready(n)]
        pool = owners or names
        return rng.choice(pool) if pool else None

    def worker(self, name: str) -> IngestProcess:
        with self._lock:
            return self.live[name][0]

    def remove(self, name: str) -> IngestProcess:
        with self._lock:
            return self.live.pop(name)[0]

    def spark_jvm(self, name: str) -> int | None:
        """Pid of the Spark JVM under a worker process (a child or grandchild running java)."""
        root = self.worker(name).pid
        return None if root is None else java_under(root)

    def ready(self, name: str) -> bool:
        with self._lock:
            entry = self.live.get(name)
        if entry is None or name in self.frozen:
            return False
        probe = self._healthz(entry[1], "readyz")
        return probe is not None and probe[0] == 200

    def live_client_ids(self) -> set[str]:
        """Client ids of the worker processes that run and are not frozen (SIGSTOP), those
        being stopped included: a draining worker owns its partitions until it leaves."""
        with self._lock:
            return {
                f"chaos-{worker.name}"
                for worker in self.all
                if worker.name not in self.frozen and worker.poll() is None
            }

    def _healthz(self, port: int, path: str = "healthz") -> tuple[int, str] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=3) as resp:
                return int(resp.status), resp.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace").strip()
        except OSError:
            return None  # not serving yet (starting) or gone

    def _supervise(self) -> None:
        while not self._stop.wait(2.0):
            with self._lock:
                snapshot = list(self.live.items())
            for name, (worker, port) in snapshot:
                if name in self.frozen:
                    continue
                code = worker.poll()
                if code is not None:
                    with self._lock:
                        if self.live.pop(name, None) is None:
                            continue
                        self.unplanned_exits += 1
                        new = self.add()
                    log_since(self._t0, f"supervisor: {name} exited on its own (code {code}); started {new}")
                    continue
                probe = self._healthz(port)
                if probe is not None and probe[0] == 503 and "splits failed" in probe[1]:
                    self._unhealthy_seen[name] += 1
                    if self._unhealthy_seen[name] >= 2:
                        with self._lock:
                            if self.live.pop(name, None) is None:
                                continue
                            self.health_restarts += 1
                            new = self.add()
                        log_since(self._t0, f"supervisor: {name} unhealthy ({probe[1]}); restarting as {new}")
                        # As an orchestrator's liveness restart: SIGTERM now, SIGKILL after the grace.
                        threading.Thread(target=stop_worker, args=(worker, 30.0), daemon=True).start()

    def shutdown(self, timeout: float = 90.0) -> None:
        self._stop.set()
        self._thread.join(10)
        stop_all(self.all, timeout)


def wait_started(proc: IngestProcess, events: tuple[str, ...], timeout_s: float = 60.0) -> bool:
    """Wait (bounded) until a process started in place of a killed one logs one of ``events``
    (it reached the metastore and runs its loop) or exits: a fault injected next, a PostgreSQL
    restart say, then meets a running process, not one still starting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if any(e.get("event") in events for e in proc.events()):
            return True
        time.sleep(0.2)
    return False


def stop_worker(worker: IngestProcess, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` (as an orchestrator's grace period)."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed with its group, as a pod would be
        worker.stop(timeout=timeout)
