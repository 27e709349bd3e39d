"""Running the Spark Structured Streaming peer (bench/peers/spark_app.py) from the project's environment.

The peer runs on the product's own pyspark, with Spark's Kafka source from the project's one
pinned jar set (``scripts/spark-jars/pom.xml``, fetched by scripts/setup.sh or on first use), in
a subprocess of this interpreter so that its process tree (the Python driver and its JVM) is
measured apart from the bench's.
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

from bench import avro_wire as avro
from bench.data import SCHEMA
from bench.procs import TreeSampler
from bench.stats import percentiles
from ingest.builder.job import DICTIONARY_PAGE_BYTES
from ingest.spark.jars import spark_jars
from ingest_dev.maven import fetch_spark_jars
from ingest_dev.process import popen

SCRIPT = Path(__file__).resolve().parent / "spark_app.py"
CONNECTOR_PREFIX = "spark-sql-kafka-0-10_2.13-"


def fetch_jars(timeout: float = 600.0) -> list[Path]:
    """The project's Spark jars (the Kafka source among them), fetched from Maven Central once."""
    return fetch_spark_jars(timeout)


def connector_version() -> str:
    """The version of Spark's Kafka source in the fetched jar set, from its jar's name."""
    try:
        names = [j.name for j in spark_jars() if j.name.startswith(CONNECTOR_PREFIX)]
    except FileNotFoundError:
        names = []
    return names[0].removeprefix(CONNECTOR_PREFIX).removesuffix(".jar") if names else "missing"


def _offsets_json(topic: str, starts: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(starts.items())}})


class SparkPeer:
    """One run of the peer script: a subprocess whose process tree (the Python driver and its
    JVM) is sampled for CPU and RSS."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        starts: dict[int, int],
        expected: int | None,
        work: Path,
        timeout: float,
        driver_memory: str,
        processing_time_s: float | None = None,
        follow: bool = False,
    ) -> None:
        """``follow``: a processing-time query that runs until :meth:`request_stop` (the freshness
        run); otherwise it stops after ``expected`` rows (or those :meth:`expect` names later)."""
        self.work = work
        self.timeout = timeout
        work.mkdir(parents=True, exist_ok=True)
        self.out = work / "out"
        self.result_path = work / "result.json"
        self.ready_path = work / "ready"
        self.log_path = work / "peer.log"
        jars = fetch_jars()
        cmd = [
            sys.executable,
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
            # The same Parquet writer settings as the workers' builds (a one-line setting any
            # Spark user has): the comparison is of the designs, not of a writer option.
            "--dictionary-page-bytes",
            str(DICTIONARY_PAGE_BYTES),
            "--timeout",
            str(timeout),
            "--result",
            str(self.result_path),
            "--ready",
            str(self.ready_path),
        ]
        wire = avro.active()
        if wire is not None:
            cmd += ["--avro-schema", avro.WRITER_SCHEMA]
        self.expected_path = work / "expected"
        self.stop_path = work / "stop"
        if follow:
            cmd += ["--stop-file", str(self.stop_path)]
        elif expected is not None:
            cmd += ["--expected", str(expected)]
        else:
            cmd += ["--expected-file", str(self.expected_path)]
        cmd += ["--available-now"] if processing_time_s is None else ["--processing-time", str(processing_time_s)]
        # The wheel's own Spark, as the workers run it.
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_PYTHON")}
        self._log = self.log_path.open("wb")
        self.sampler = TreeSampler()
        self.proc = popen(cmd, cwd=work, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.sampler.add_root(self.proc.pid)
        if not follow:
            # A follow run is sampled by hand, around each probe, like the freshness run's other systems.
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

    def request_stop(self) -> None:
        """A follow run stops its query at its next check (then :meth:`finish`)."""
        self.stop_path.touch()

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
    peer = SparkPeer(bootstrap, topic, dict.fromkeys(ends, 0), records, work, timeout, driver_memory)
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
    peer = SparkPeer(bootstrap, topic, ends, None, work, timeout, driver_memory, processing_time_s=trigger_s)
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
