"""Workers whose Spark is a Spark Connect server (``INGEST_SPARK_MASTER=sc://…``).

The server is the one the pyspark wheel ships, started by the ``spark_connect`` fixture on
this machine, so the staging and segment directories are shared storage for both sides.
Workers run as processes: a Connect session puts PySpark into remote mode process-wide.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from bench.procs import process_tree, tree_rss_bytes
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.process import run_process
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    REPO,
    NewSource,
    assert_exactly_once,
    process_env,
    sample_value,
    write_spec,
)
from tests.fixtures.servers import MakeTopic
from tests.integration.test_avro_poison import assert_rows_and_rejects, produce_poison

pytestmark = pytest.mark.process


def bad_every_500(i: int) -> bytes:
    return b"{not json" if i % 500 == 7 else sample_value(i)


# A thin worker (the Python process alone: confluent-kafka, pyarrow, the pyspark client) was
# ~180-250 MB here; one with local Spark carries a JVM of ~1-2.5 GB besides. A generous bound:
# what it guards is "no JVM", which the process tree shows directly.
THIN_WORKER_RSS_BOUND = 700 * 2**20


def test_a_worker_on_spark_connect_publishes_every_offset_exactly_once(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_connect: str
) -> None:
    source, produced = new_source(2, max_records=1000, max_age="1s")
    produced.produce(4000, bad_every_500)
    worker = IngestProcess.worker(
        process_env(database_url, kafka_bootstrap, INGEST_SPARK_MASTER=spark_connect), source, tmp_path, "connect"
    )
    try:
        with Metastore(database_url) as store:
            wait_until(
                lambda: (
                    produced.caught_up(store, source) or worker.poll() is not None or worker.has_event("build_failed")
                ),
                240,
                "the worker on Spark Connect to publish everything",
            )
        # A thin client: the builds ran on the server, so no JVM was ever started under the worker.
        assert worker.pid is not None
        tree = process_tree([worker.pid])
        jvms = {pid: st.comm for pid, st in tree.items() if st.comm == "java"}
        assert not jvms, {pid: st.comm for pid, st in tree.items()}
        rss = tree_rss_bytes(tree, worker.pid)
        print(f"thin worker: {len(tree)} process(es), RSS {rss / 2**20:.0f} MB")
        assert rss < THIN_WORKER_RSS_BOUND, rss
    finally:
        worker.stop(timeout=90)
    failures = [e["error"] for e in worker.events() if e.get("event") in ("build_retry", "build_failed")]
    assert not failures, failures[:3]
    assert worker.poll() == 0, worker.log_path.read_text()[-3000:]
    assert worker.has_event("worker_started", spark_master=spark_connect)
    result = assert_exactly_once(database_url, source, produced)
    # Rejects went through the server too (a second write job), in the same transaction.
    assert (result.rows, result.rejects) == (3992, 8)


def test_interrupting_a_tag_cancels_a_running_job_on_the_connect_server(spark_connect: str) -> None:
    """The kill switch's Spark half under Connect: ``interruptTag`` from another thread ends
    the tagged job (the builder tags each split's jobs and interrupts that tag on revoke)."""
    script = textwrap.dedent(f"""
        import threading, time
        from ingest.spark.start import create_session

        spark = create_session({spark_connect!r}, "interrupt-test")
        outcome = []

        def run():
            spark.addTag("ingest-split-x")
            try:
                # Never finishes and never overflows (ANSI mode fails an overflowing sum at once).
                spark.range(0, 10**13, 1, 1).selectExpr("sum(id % 7) AS s").collect()
                outcome.append("finished")
            except Exception as exc:
                outcome.append(type(exc).__name__ + ": " + str(exc).splitlines()[0])
            finally:
                spark.removeTag("ingest-split-x")

        job = threading.Thread(target=run)
        job.start()
        interrupted = []
        for _ in range(240):  # the job has to be running before it can be interrupted
            time.sleep(0.5)
            interrupted = spark.interruptTag("ingest-split-x")
            if interrupted or not job.is_alive():
                break
        job.join(120)
        print("INTERRUPTED", len(interrupted), "ALIVE", job.is_alive(), "OUTCOME", outcome)
        spark.stop()
    """)
    proc = run_process(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=process_env("postgresql://unused", "unused:9092"),
    )
    last = [line for line in proc.stdout.splitlines() if line.startswith("INTERRUPTED")]
    assert proc.returncode == 0 and last, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ALIVE False" in last[0] and "INTERRUPTED 0" not in last[0], last[0]
    assert "finished" not in last[0], last[0]


def test_a_revoke_never_waits_for_an_unresponsive_connect_server(tmp_path: Path, spark_connect: str) -> None:
    """The kill switch trips in the rebalance callback. Under Connect the job interrupt is a
    gRPC call, which waits as long as the server is silent (a frozen JVM, a black-holed path:
    here a proxy that stops forwarding): the trip must return at once all the same, and the
    interrupt go through once the server answers again."""
    _, spec_path = write_spec(tmp_path, "connect-revoke")
    port = int(spark_connect.rsplit(":", 1)[1])
    script = textwrap.dedent(f"""
        import os, threading, time, uuid
        from pathlib import Path
        from ingest.builder.job import SparkSegmentBuilder
        from ingest.spark.session import start_abandoned
        from ingest.spark.start import create_session
        from ingest.builder.kafka_read import KafkaReader
        from ingest.splits.kill_switch import KillSwitch
        from ingest.splits.split import SealedSplit
        from ingest.errors import SplitKilled
        from ingest.spec.parse import load_spec_file
        from ingest_common.model import TopicPartition
        from ingest_dev.tcp_proxy import TcpProxy

        proxy = TcpProxy({port})
        spark = create_session(f"sc://127.0.0.1:{{proxy.port}}", "revoke-test")
        spark.range(3).count()  # the session is up and answers through the proxy
        spec, _ = load_spec_file(Path({str(spec_path)!r}))
        split = SealedSplit(
            id=uuid.uuid4(), tp=TopicPartition("connect-revoke", 0), serial=1, start=0, end=1,
            leader_epoch=None, estimated_bytes=2, available_at=0.0, sealed_at=0.0,
            seal_reason="test", kill_switch=KillSwitch(),
        )
        trip_s = []

        class RevokedWhileRegistering:
            def register(self, build, splits):
                proxy.pause()  # the server goes silent, then the partition is revoked
                started = time.monotonic()
                split.kill_switch.trip("revoke")
                trip_s.append(time.monotonic() - started)

        results = []
        builder = SparkSegmentBuilder(spark, RevokedWhileRegistering(), KafkaReader.of("127.0.0.1:1", "revoke-test"))
        build = threading.Thread(target=lambda: results.extend(builder.build_batch([split], spec)), daemon=True)
        build.start()
        build.join(30)
        if build.is_alive():
            print("TRIP BLOCKED", flush=True)
            os._exit(0)
        print("TRIP", round(trip_s[0], 2), "RESULT", type(results[0]).__name__, flush=True)
        proxy.resume()
        for _ in range(600):  # the interrupt, held by the silent server, now goes through
            if not start_abandoned():
                break
            time.sleep(0.1)
        print("INTERRUPT_PENDING", start_abandoned(), flush=True)
        os._exit(0)
    """)
    proc = run_process(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=process_env("postgresql://unused", "unused:9092"),
    )
    out = proc.stdout
    assert proc.returncode == 0 and "TRIP" in out, out[-2000:] + proc.stderr[-3000:]
    assert "TRIP BLOCKED" not in out, out
    trip = next(line for line in out.splitlines() if line.startswith("TRIP")).split()
    assert trip[3] == "SplitKilled", out
    # The callback returned without waiting for the server (well under a second when it works).
    assert float(trip[1]) < 5.0, out
    assert "INTERRUPT_PENDING False" in out, out


# A Connect session puts PySpark in remote mode process-wide: the builds run in a process of their own.
POISON_BUILDS = """
import json, pickle, sys
from ingest.spark.start import create_session
from ingest.spec.parse import spec_from_dict
from ingest_common.model import TopicPartition
from tests.fakes import RecordingRegistrar
from tests.kafka_splits import spark_builder, split_of

args = json.loads(sys.argv[1])
spark = create_session(args["url"], "poison-test")
builder = spark_builder(spark, args["bootstrap"], RecordingRegistrar())
spec, tp = spec_from_dict(args["spec"]), TopicPartition(args["topic"], 0)
results = [builder.build_batch([split_of(tp, args["start"], args["end"])], spec)[0] for _ in range(2)]
with open(args["out"], "wb") as out:
    pickle.dump(results, out)
spark.stop()
"""


def test_lying_avro_lengths_are_rejects_and_the_server_lives_on(
    spark_connect: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    """tests/integration/test_avro_poison.py's records built by the Connect server (started
    with Avro's length limits on its command line, ingest_dev.spark_connect): without them the
    first lying length is an OutOfMemoryError, the server's JVM exits and every worker's builds
    with it. Here the poisons are rejects, twice: the server survived the first build."""
    topic = make_topic(partitions=1, prefix="poison")
    poison = produce_poison(kafka_bootstrap, topic, schema_registry_url, tmp_path / "store")
    out = tmp_path / "results.pickle"
    args = {
        "url": spark_connect,
        "bootstrap": kafka_bootstrap,
        "spec": poison.spec,
        "topic": topic,
        "start": poison.offsets.start,
        "end": poison.offsets.end,
        "out": str(out),
    }
    proc = run_process(
        [sys.executable, "-c", POISON_BUILDS, json.dumps(args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with out.open("rb") as f:
        results = pickle.load(f)  # written by the script above
    assert len(results) == 2
    for segment in results:  # the second: the server survived the first
        assert_rows_and_rejects(segment, poison)
