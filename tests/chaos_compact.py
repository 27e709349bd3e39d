"""The chaos run's compactor (on unless ``--no-compact``): one ``ingest compact SOURCE --every S``
process beside the workers with a small target size, so it replaces segments all through the
run; the ``compact_kill`` fault (SIGKILL it inside a job, start another); and the checks that
hold with replaced segments in play: gc never deletes a file a current segment lists, and at
the end ``ingest audit SOURCE --files`` run as an operator would."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from pyarrow.fs import FileType

from ingest.segments import store as segment_store
from ingest_dev.ingest_process import REPO, IngestProcess
from metastore import Metastore
from tests.chaos_fleet import wait_started

# A pass every few seconds, one Spark job per chunk (a partition's segments published since the
# last pass): it keeps up with the workers without many tiny jobs.
EVERY_S = 10.0
# Well above the run's segments (tens of KiB each), so passes find chunks all through the run;
# a compacted segment over a sixteenth of it is not rewritten again (ingest.compact.plan), so
# each record is rewritten about once.
TARGET_SIZE = "256KiB"
# The compactor (and the Spark JVM it starts) runs niced, as a batch job beside the workers
# would: on a loaded machine it takes the CPU they leave rather than a third of it.
NICENESS = 5
# How long compact_kill waits for the compactor to be inside a job (registered, not yet
# replaced) before it kills it wherever it is.
KILL_WAIT_S = 20.0
# Within a job, the kill lands this long after its registration: from before Spark writes to
# after its files are written (a job here takes one to a few seconds).
KILL_DELAY_S = (0.0, 2.0)
# The exit code a compactor may leave with on its own: PostgreSQL unreachable at its start (a
# pg fault); the supervisor starts another. Any other exit fails the run.
METASTORE_UNAVAILABLE_EXIT = 7
AUDIT_TIMEOUT_S = 300.0
# A SIGTERM interrupts the pass (ingest.roles.runner.STOP_GRACE_S) and closes the Spark session
# (its Connect retry bound): well within this.
STOP_TIMEOUT_S = 120.0
# Of a stack dump, the lines a problem quotes.
STACK_LINES = 80

_JOB_EVENTS = ("compaction_registered", "compaction_replaced", "compaction_refused", "compaction_retry")


def _jobs(proc: IngestProcess) -> list[str]:
    """The compactor's job events so far, in order."""
    return [str(e["event"]) for e in proc.events() if e.get("event") in _JOB_EVENTS]


def _in_job(jobs: list[str]) -> bool:
    return bool(jobs) and jobs[-1] == "compaction_registered"


class Compactor:
    """The one ``python -m ingest compact`` role process, and the supervisor that starts
    another when it exits on its own (as an orchestrator would)."""

    def __init__(self, env: Mapping[str, str], source: str, log_dir: Path, t0: float) -> None:
        self._env = dict(env)
        self._source = source
        self._log_dir = log_dir
        self._t0 = t0
        self._lock = threading.Lock()
        self._started = 0
        self._proc: IngestProcess | None = None
        self.all: list[IngestProcess] = []
        self.kills = 0
        # Exit codes of compactors that ended on their own.
        self.exits: list[int] = []
        # Not stopped within STOP_TIMEOUT_S of its SIGTERM: where its threads were.
        self.late: list[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="chaos-compactor", daemon=True)

    def start(self) -> None:
        with self._lock:
            self._spawn()
        self._thread.start()

    def _spawn(self) -> str:
        self._started += 1
        name = f"compactor-{self._started}"
        command = ["compact", self._source, "--every", f"{EVERY_S:g}", "--target-size", TARGET_SIZE]
        self._proc = IngestProcess(command, self._env, self._log_dir, name).start()
        if self._proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # gone already: the supervisor sees it
                os.setpriority(os.PRIO_PROCESS, self._proc.pid, NICENESS)
        self.all.append(self._proc)
        return name

    def kill_in_job(self, rng: random.Random) -> str:
        """SIGKILL the compactor inside a job (a random moment after the job's registration: its
        Spark job running or its files written), one after its first if it gets there within
        KILL_WAIT_S (the first job also starts the compactor's Spark session), otherwise in the
        job it is in or wherever it is; start another. Returns what was hit."""
        with self._lock:
            proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + KILL_WAIT_S
        jobs = _jobs(proc)
        while time.monotonic() < deadline and proc.poll() is None:
            if _in_job(jobs) and "compaction_replaced" in jobs:
                break
            time.sleep(0.1)
            jobs = _jobs(proc)
        where = "outside a job"
        if _in_job(jobs):
            first = "compaction_replaced" not in jobs
            time.sleep(rng.uniform(*KILL_DELAY_S))
            where = "in its first job" if first else "in a job"
            if not _in_job(_jobs(proc)):
                where = "just after a job"
        with self._lock:
            proc.kill()
            self.kills += 1
            self._spawn()
            new = self._proc
        assert new is not None
        wait_started(new, ("compactor_active", "compactor_standby"))
        return f"{proc.name} ({where})"

    def _supervise(self) -> None:
        while not self._stop.wait(2.0):
            with self._lock:
                proc = self._proc
                code = proc.poll() if proc is not None else None
                if code is None:
                    continue
                self.exits.append(code)
                name = self._spawn()
            print(
                f"[chaos {time.monotonic() - self._t0:7.1f}s] supervisor: the compactor exited on its own "
                f"(code {code}); started {name}",
                flush=True,
            )

    def problems(self) -> list[str]:
        late = []
        if self.late is not None:
            stacks = "\n".join(self.late[-STACK_LINES:]) or "(no stack dump in its log)"
            late = [f"the compactor did not stop within {STOP_TIMEOUT_S:g} s of its SIGTERM; its threads:\n{stacks}"]
        return late + [f"a compactor exited with {code}" for code in self.exits if code != METASTORE_UNAVAILABLE_EXIT]

    def stop(self) -> None:
        """SIGTERM: the role ends its pass and exits 0."""
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stop(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.late = proc.stacks()
        if (code := proc.poll()) not in (0, None):
            self.exits.append(code)


def replaced_segments(store: Metastore, source: str) -> int:
    """Segments replaced by compaction so far (a replacement's own segment replaced later counts too)."""
    return int(store.replaced_counts(source)["total"])


def unlisted_files(store: Metastore, source: str) -> list[str]:
    """Files a current segment lists that are not in the store, as findings. Called right after
    a gc, while no other gc runs: nothing else deletes a listed file, so any is gc's doing."""
    gone = []
    for seg in store.segments(source):
        for uri in list(seg["files"]) + list(seg["rejects_files"]):
            fs, path = segment_store.filesystem(uri)
            if fs.get_file_info(path).type == FileType.NotFound:
                gone.append(f"gc deleted {uri}, which current segment {seg['id']} lists")
    return gone


def audit_files(env: Mapping[str, str], source: str) -> tuple[int, list[str]]:
    """``ingest audit SOURCE --files`` as an operator runs it: its exit code and its lines."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ingest", "audit", source, "--files"],
            env=dict(env),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=AUDIT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return -1, [f"ingest audit did not finish within {AUDIT_TIMEOUT_S:.0f}s"]
    return done.returncode, (done.stdout + done.stderr).splitlines()
