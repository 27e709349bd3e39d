"""The freshness run's systems, each kept running on a topic of its own (bench/freshness/phase.py).

A follower is one system reading its topic from the start until told to stop: the raw baseline
(``bench/peers/raw.py --follow``), Quix Streams (``bench/peers/quix_app.py --follow``), Spark Structured
Streaming with a processing-time trigger (``bench/peers/spark_app.py --stop-file``) and one ingest
worker. Each says which rows became visible since it was last asked (:meth:`Follower.new_units`)
and is sampled by hand around each probe (CPU and RSS of its process tree), so no sampling
thread runs while another system is probed. Kept running between probes, a JVM stays warm, as
in a deployment; a system idles while the others are probed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench.freshness.visibility import Unit
from bench.ingest_runs import REPO, Context, Fleet, SplitConfig, apply_source, verify, worker_env
from bench.peers import quix
from bench.peers.spark import SparkPeer
from bench.procs import TreeSampler
from ingest_dev.process import popen
from metastore import Metastore


class Follower(ABC):
    """One system of the freshness run."""

    key: str
    label: str
    guarantee: str

    def __init__(self, topic: str, work: Path) -> None:
        self.topic = topic
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.sampler = TreeSampler()

    @abstractmethod
    def new_units(self) -> list[Unit]:
        """Rows made visible since the last call, oldest first."""

    @abstractmethod
    def check_alive(self) -> None:
        """Raise RuntimeError, with its log's tail, if the system's process has exited."""

    @abstractmethod
    def stop(self, ends: dict[int, int]) -> dict[str, Any]:
        """Stop it; what it wrote against the topic's final ``ends``, its exactly-once check where
        it has one (``{"ok": ..., "summary": ...}`` under ``exactly_once``)."""


class _ScriptFollower(Follower):
    """A system that is one script in a subprocess, stopped by a file it watches."""

    def _launch(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.stop_path = self.work / "stop"
        self.log_path = self.work / "follower.log"
        self._log = self.log_path.open("wb")
        self.proc = popen(cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.sampler.add_root(self.proc.pid)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.label} exited with {self.proc.returncode}:\n{tail}")

    def _finish(self, timeout: float = 120.0) -> None:
        self.stop_path.touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(30)
        finally:
            self._log.close()


class RawFollower(_ScriptFollower):
    key = "raw"
    label = "raw baseline"
    guarantee = "none"

    def __init__(self, bootstrap: str, topic: str, work: Path, interval_s: float, timeout: float) -> None:
        super().__init__(topic, work)
        self.out = work / "out"
        self._seen: set[Path] = set()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "bench.peers.raw", "--follow", "--bootstrap", bootstrap, "--topic", topic]
        cmd += ["--flush-s", str(interval_s), "--stop", str(work / "stop"), "--out", str(self.out)]
        cmd += ["--timeout", str(timeout), "--result", str(work / "result.json"), "--batch", "1000000"]
        self._launch(cmd, env, REPO)

    def new_units(self) -> list[Unit]:
        fresh = sorted(p for p in self.out.glob("part-*.parquet") if p not in self._seen) if self.out.exists() else []
        self._seen.update(fresh)
        return sorted((Unit(p.stat().st_mtime, (str(p),)) for p in fresh), key=lambda u: u.visible_at)

    def stop(self, ends: dict[int, int]) -> dict[str, Any]:
        self._finish()
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in self._seen)
        return {"rows": rows, "produced": sum(ends.values())}


class QuixFollower(_ScriptFollower):
    key = "quix"
    label = "Quix Streams"
    guarantee = "at-least-once"

    def __init__(self, python: str, bootstrap: str, topic: str, work: Path, interval_s: float, timeout: float) -> None:
        super().__init__(topic, work)
        self.visible_path = work / "visible.jsonl"
        self._read = 0
        cmd = [python, str(quix.SCRIPT), "--follow", "--bootstrap", bootstrap, "--topic", topic]
        cmd += ["--group", f"bench-quix-{uuid.uuid4().hex[:8]}", "--directory", "quix_out"]
        cmd += ["--commit-interval", str(interval_s), "--timeout", str(timeout), "--result", str(work / "result.json")]
        cmd += ["--stop", str(work / "stop"), "--visible", str(self.visible_path)]
        # Its own virtualenv, not the project's (bench/peers/quix.py says why).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONWARNINGS"] = "ignore"
        self._launch(cmd, env, work)

    def new_units(self) -> list[Unit]:
        if not self.visible_path.exists():
            return []
        lines = self.visible_path.read_text().splitlines()
        # A line still being written has no newline yet: the text ends without one.
        complete = lines if self.visible_path.read_text().endswith("\n") else lines[:-1]
        fresh = complete[self._read :]
        self._read = len(complete)
        return [Unit(float(d["at"]), (str(d["path"]),)) for d in map(json.loads, fresh)]

    def stop(self, ends: dict[int, int]) -> dict[str, Any]:
        self._finish()
        result_path = self.work / "result.json"
        rows = json.loads(result_path.read_text())["rows"] if result_path.exists() else None
        return {"rows": rows, "produced": sum(ends.values())}


class SparkFollower(Follower):
    key = "spark"
    label = "Spark Structured Streaming"
    guarantee = "exactly-once"

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, work: Path, interval_s: float, timeout: float, memory: str
    ) -> None:
        super().__init__(topic, work)
        starts = dict.fromkeys(range(partitions), 0)
        self.peer = SparkPeer(bootstrap, topic, starts, None, work, timeout, memory, interval_s, follow=True)
        self.sampler = self.peer.sampler
        self._seen_entries: set[str] = set()
        self._seen_files: set[str] = set()

    def _entries(self) -> list[Path]:
        """The sink's log, by batch: ``N`` and, every tenth batch (Spark's default), ``N.compact``
        holding every file committed so far."""
        meta = self.peer.out / "_spark_metadata"
        if not meta.exists():
            return []
        entries = [p for p in meta.iterdir() if p.name.removesuffix(".compact").isdigit()]
        return sorted(entries, key=lambda p: int(p.name.removesuffix(".compact")))

    @staticmethod
    def _files(entry: Path) -> list[str]:
        lines = entry.read_text().splitlines()[1:]  # the first line is the log's version ("v1")
        return [json.loads(line)["path"] for line in lines if line.strip()]

    def new_units(self) -> list[Unit]:
        units: list[Unit] = []
        for entry in self._entries():
            if entry.name in self._seen_entries:
                continue
            self._seen_entries.add(entry.name)
            fresh = [f for f in self._files(entry) if f not in self._seen_files]
            self._seen_files.update(fresh)
            units.append(Unit(entry.stat().st_mtime, tuple(fresh)))
        return units

    def check_alive(self) -> None:
        if self.peer.proc.poll() is not None:
            tail = self.peer.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.label} exited with {self.peer.proc.returncode}:\n{tail}")

    def stop(self, ends: dict[int, int]) -> dict[str, Any]:
        self.peer.request_stop()
        self.peer.finish()
        coordinates: set[tuple[int, int]] = set()
        rows = 0
        # Every committed file once (a compacted entry repeats the earlier ones).
        for path in {f for entry in self._entries() for f in self._files(entry)}:
            table = pq.read_table(path.removeprefix("file:"), columns=["_partition", "_offset"])
            rows += table.num_rows
            coordinates.update(zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True))
        produced = sum(ends.values())
        expected = {(p, o) for p, end in ends.items() for o in range(end)}
        ok = rows == produced and coordinates == expected
        summary = f"{rows} rows committed, {len(coordinates)} distinct offsets, for {produced} produced"
        return {"rows": rows, "produced": produced, "exactly_once": {"ok": ok, "summary": summary}}


class IngestFollower(Follower):
    key = "ingest"
    label = "ingest, 1 worker"
    guarantee = "exactly-once"

    def __init__(self, ctx: Context, topic: str, work: Path, interval_s: float) -> None:
        super().__init__(topic, work)
        self.ctx = ctx
        self.source = ctx.new_source("fresh")
        # max_age is the interval; the other limits only seal splits of a backlog.
        apply_source(ctx, self.source, topic, SplitConfig(max_age=f"{interval_s:g}s"))
        self.fleet = Fleet(ctx, self.source, worker_env(ctx, "local[2]", 2))
        self.sampler = self.fleet.sampler
        self.fleet.add("fresh-ingest-0")
        self._store = Metastore(ctx.database_url)
        self._seen: set[int] = set()
        self._since: datetime | None = None

    def new_units(self) -> list[Unit]:
        units: list[Unit] = []
        for seg in self._store.segments(self.source, since=self._since):
            if int(seg["id"]) in self._seen:
                continue
            self._seen.add(int(seg["id"]))
            published_at: datetime = seg["published_at"]
            self._since = published_at if self._since is None else max(self._since, published_at)
            units.append(Unit(published_at.timestamp(), tuple(str(f) for f in seg["files"])))
        return units

    def check_alive(self) -> None:
        self.fleet.check_alive()

    def stop(self, ends: dict[int, int]) -> dict[str, Any]:
        try:
            self.fleet.stop()
        finally:
            self._store.close()
        check = verify(self.ctx, self.source, self.topic, ends)
        return {"source": self.source, "produced": sum(ends.values()), "exactly_once": check}
