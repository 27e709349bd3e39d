"""Setting up and running the Spark Structured Streaming peer (bench/peer_spark.py) from the project's environment.

Spark's Kafka source, ``org.apache.spark:spark-sql-kafka-0-10_2.13``, is not published on
Maven Central for Spark 4.3.0 (the product's pinned pyspark): the newest release there is
4.2.0.  The product's pin is not changed for a benchmark; the peer runs under its own
virtualenv with ``pyspark==4.2.0`` and the 4.2.0 connector (``scripts/spark-kafka-jars/pom.xml``),
both set up on first use (or by ``python -m bench --setup-peer``, which scripts/setup.sh runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.data import SCHEMA
from bench.procs import TreeSampler
from bench.stats import percentiles
from ingest.build.spark_jars import maven_cache
from ingest_dev.maven import maven_fetch

# Keep equal to <spark.version> in scripts/spark-kafka-jars/pom.xml: connector and engine
# must be one Spark release.
SPARK_VERSION = "4.2.0"
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ingest-bench" / "spark-venv"
SCRIPT = Path(__file__).resolve().parent / "peer_spark.py"
JARS_POM = Path(__file__).resolve().parent.parent / "scripts" / "spark-kafka-jars" / "pom.xml"


def _has_connector(libs: Path) -> bool:
    return libs.is_dir() and any(libs.glob(f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar"))


def fetch_jars(timeout: float = 600.0) -> list[Path]:
    """The connector and its dependencies, fetched from Maven Central once (cache keyed by the pom)."""
    libs = maven_fetch(
        JARS_POM, maven_cache(JARS_POM, "spark-kafka-jars"), "Spark's Kafka source", _has_connector, timeout
    )
    return sorted(libs.glob("*.jar"))


def _pyspark_version(python: str) -> str | None:
    try:
        proc = subprocess.run(
            [python, "-c", "import pyspark; print(pyspark.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def find_python(explicit: str | None = None) -> tuple[str | None, str]:
    """The peer venv's Python if it has the matching pyspark, or None and why not."""
    python = explicit or os.environ.get("BENCH_SPARK_PYTHON") or str(DEFAULT_VENV / "bin" / "python")
    if not Path(python).exists():
        return None, f"no peer virtualenv at {python} (run `python -m bench --setup-peer`)"
    found = _pyspark_version(python)
    if found != SPARK_VERSION:
        return None, f"{python} has pyspark {found}, the Kafka connector needs {SPARK_VERSION} (run --setup-peer)"
    return python, ""


def setup_venv(venv: Path = DEFAULT_VENV) -> str:
    """Create the peer's virtualenv with the pinned pyspark and fetch the connector; returns its Python."""
    python = venv / "bin" / "python"
    if _pyspark_version(str(python)) != SPARK_VERSION:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"pyspark=={SPARK_VERSION}"], check=True, timeout=1800
        )
    fetch_jars()
    return str(python)


def _offsets_json(topic: str, starts: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(starts.items())}})


class SparkPeer:
    """One run of the peer script: a subprocess whose process tree (the Python driver and its
    JVM) is sampled for CPU and RSS."""

    def __init__(
        self,
        python: str,
        bootstrap: str,
        topic: str,
        starts: dict[int, int],
        expected: int | None,
        work: Path,
        timeout: float,
        driver_memory: str,
        processing_time_s: float | None = None,
    ) -> None:
        self.work = work
        self.timeout = timeout
        work.mkdir(parents=True, exist_ok=True)
        self.out = work / "out"
        self.result_path = work / "result.json"
        self.ready_path = work / "ready"
        self.log_path = work / "peer.log"
        jars = fetch_jars()
        cmd = [
            python,
            str(SCRIPT),
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--starting-offsets",
            _offsets_json(topic, starts),
            "--schema",
            json.dumps(SCHEMA),
            "--jars",
            ",".join(str(j) for j in jars),
            "--out",
            str(self.out),
            "--checkpoint",
            str(work / "checkpoint"),
            "--driver-memory",
            driver_memory,
            "--timeout",
            str(timeout),
            "--result",
            str(self.result_path),
            "--ready",
            str(self.ready_path),
        ]
        self.expected_path = work / "expected"
        cmd += ["--expected", str(expected)] if expected is not None else ["--expected-file", str(self.expected_path)]
        cmd += ["--available-now"] if processing_time_s is None else ["--processing-time", str(processing_time_s)]
        # Not the project's environment: the venv's own pyspark, no PYTHONPATH into the repo.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "PYSPARK_PYTHON")}
        self._log = self.log_path.open("wb")
        self.sampler = TreeSampler()
        self.proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.sampler.add_root(self.proc.pid)
        self.sampler.start()

    def wait_ready(self, timeout: float = 180.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.ready_path.exists():
                return True
            time.sleep(0.1)
        return self.ready_path.exists()

    def expect(self, rows: int) -> None:
        """Tell a processing-time run how many rows to wait for (written atomically)."""
        tmp = self.expected_path.with_suffix(".tmp")
        tmp.write_text(str(rows))
        tmp.replace(self.expected_path)

    def finish(self) -> dict[str, Any]:
        """Wait for the script to exit; its result, or ``{"status": "n/a", ...}`` and why."""
        try:
            self.proc.wait(timeout=self.timeout + 120)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        finally:
            self.sampler.stop()
            self._log.close()
        if not self.result_path.exists():
            tail = self.log_path.read_text(errors="replace")[-2000:]
            return {"status": "n/a", "reason": f"spark peer exited {self.proc.returncode} without a result: {tail}"}
        raw: dict[str, Any] = json.loads(self.result_path.read_text())
        return raw


def run_throughput(
    python: str,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    records: int,
    value_bytes: int,
    work: Path,
    timeout: float,
    driver_memory: str,
) -> dict[str, Any]:
    """``trigger(availableNow=True)`` over the whole topic from offset 0; the measured span is
    the query's start to its termination (session start-up before it, as the workers' Spark
    start-up is before theirs)."""
    peer = SparkPeer(python, bootstrap, topic, dict.fromkeys(ends, 0), records, work, timeout, driver_memory)
    raw = peer.finish()
    if raw.get("status") == "n/a":
        return raw
    if not raw["ok"]:
        why = raw["error"] or ("timed out" if raw["timed_out"] else "")
        return {"status": "n/a", "reason": f"spark peer committed {raw['rows']} of {records} rows {why}".strip()}
    t0, t1 = raw["query_started_at"], raw["query_finished_at"]
    wall = max(t1 - t0, 1e-6)
    cpu = peer.sampler.cpu_at(t1) - peer.sampler.cpu_at(t0)
    return {
        "system": "spark-structured-streaming",
        "version": raw["spark_version"],
        "guarantee": "exactly-once (checkpoint + _spark_metadata)",
        "trigger": "availableNow",
        "records": records,
        "rows_written": raw["rows"],
        # The exactly-once check of this run: rows committed through _spark_metadata == produced.
        "exactly_once": raw["rows"] == records,
        "value_bytes": value_bytes,
        "wall_s": wall,
        "records_per_s": records / wall,
        "mb_per_s": value_bytes / wall / 1e6,
        "cpu_s": cpu,
        "cpu_s_per_million": cpu / records * 1e6,
        "peak_rss_mb": peer.sampler.peak_rss_bytes() / 2**20,
        "files": raw["files"],
        "file_bytes": raw["file_bytes"],
        "session_start_s": raw["session_ready_at"] - raw["launched_at"],
        "launch_to_done_s": t1 - raw["launched_at"],
    }


def produce_to_visible(out: Path) -> list[float]:
    """Per committed batch with rows: when its ``_spark_metadata`` entry was written (the moment
    the rows become visible to readers of the sink) minus the newest Kafka timestamp in it."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    latencies: list[float] = []
    meta = out / "_spark_metadata"
    for entry in sorted(meta.iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit():
            continue  # compacted logs are named N.compact; the bench's runs are far too short for one
        visible_at = entry.stat().st_mtime
        newest: float | None = None
        for line in entry.read_text().splitlines()[1:]:  # first line is the log version ("v1")
            path = json.loads(line)["path"].removeprefix("file:")
            column = pq.read_table(path, columns=["_timestamp"])["_timestamp"]
            if len(column):
                value = pc.max(column).as_py()
                ts = value.timestamp() if value is not None else None
                if ts is not None:
                    newest = ts if newest is None else max(newest, ts)
        if newest is not None:
            latencies.append(visible_at - newest)
    return latencies


def latency_summary(samples: list[float], trigger_s: float, records: int, ok: bool) -> dict[str, Any]:
    return {
        "trigger_processing_time_s": trigger_s,
        "records": records,
        "exactly_once": ok,
        "produce_to_visible_s": percentiles(samples),
        "produce_to_visible_samples_s": sorted(samples),
    }


def run_latency(
    python: str,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    work: Path,
    timeout: float,
    driver_memory: str,
    trigger_s: float,
    produce: Callable[[], int],
) -> dict[str, Any]:
    """A processing-time query from the current log ends; once its first batch has run,
    ``produce()`` writes the steady records (returning how many), and the query stops after
    committing exactly that many.  Produce-to-visible per batch, from the sink's files."""
    peer = SparkPeer(python, bootstrap, topic, ends, None, work, timeout, driver_memory, processing_time_s=trigger_s)
    if not peer.wait_ready():
        peer.proc.terminate()
        raw = peer.finish()
        return {"status": "n/a", "reason": f"spark peer never ran its first batch: {raw.get('reason', raw)}"}
    records = produce()
    peer.expect(records)
    raw = peer.finish()
    if raw.get("status") == "n/a":
        return raw
    if not raw["ok"]:
        return {"status": "n/a", "reason": f"spark peer committed {raw['rows']} of {records} rows {raw['error'] or ''}"}
    return latency_summary(produce_to_visible(peer.out), trigger_s, records, raw["rows"] == records)
