"""The ``ingest`` command line as a user runs it: one clear line for expected failures."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from ingest.builder.job import BuilderFactory
from ingest_dev.process import popen, run_process
from ingest_dev.testkit import free_port, wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    REPO,
    NewSource,
    StartWorker,
    apply_spec,
    assert_exactly_once,
    process_env,
    settings,
    write_spec,
)


def ingest(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_process(
        [sys.executable, "-m", "ingest", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int | None, *needles: str) -> None:
    """``code`` None: any failure."""
    assert result.returncode == code if code is not None else result.returncode != 0, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ingest: error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_expected_failures_are_one_line(tmp_path: Path, database_url: str, kafka_bootstrap: str) -> None:
    env = process_env(database_url, kafka_bootstrap)
    assert "already up to date" in ingest(env, "migrate").stdout

    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ntopics = ["t"]\nevent_time = "ts"\n[schema]\nts = "timestamp"\nn = "decimal"\n')
    assert_one_line_error(ingest(env, "source", "apply", str(bad)), 2, "schema.n", "decimal")
    assert_one_line_error(ingest(env, "source", "apply", str(tmp_path / "missing.toml")), 2, "cannot read")
    assert_one_line_error(ingest(env, "status", "nope"), 3, "unknown source 'nope'")

    down = {**env, "INGEST_DATABASE_URL": f"postgresql://ingest:s3cret@127.0.0.1:{free_port()}/db"}
    result = ingest(down, "segments", "x")
    assert_one_line_error(result, 7, "PostgreSQL unavailable", "ingest:***@")
    assert "s3cret" not in result.stderr
    # migrate --wait retries connecting (PostgreSQL still starting), then gives the same one line.
    started = time.monotonic()
    result = ingest(down, "migrate", "--wait", "3")
    assert time.monotonic() - started >= 2
    assert_one_line_error(result, 7, "PostgreSQL unavailable")
    assert "waiting for PostgreSQL" in result.stderr and "s3cret" not in result.stderr
    assert_one_line_error(ingest(env, "migrate", "--wait", "soon"), 2, "--wait")
    for bad_url, says in (
        ("postgresql://u@127.0.0.1:99999/db", "invalid port"),
        ("postgresql://u@[::1:5432/db", "IPv6"),
        ("host=127.0.0.1 port=x dbname=db", "port"),
    ):
        assert_one_line_error(ingest({**env, "INGEST_DATABASE_URL": bad_url}, "migrate"), None, says)

    unmigrated = {**env, "INGEST_DATABASE_URL": database_url.rsplit("/", 1)[0] + "/postgres"}
    assert_one_line_error(ingest(unmigrated, "status", "x"), 8, "ingest migrate")

    name, spec = write_spec(tmp_path, "no-such-topic-" + uuid.uuid4().hex[:6])
    assert ingest(env, "source", "apply", str(spec)).stdout.strip() == f"source {name}: version 1"
    assert "(unchanged)" in ingest(env, "source", "apply", str(spec)).stdout
    assert_one_line_error(ingest(env, "worker", name), 5, "does not exist")
    # A store inside another source's directory, or a store URI pyarrow would cut short.
    nested = tmp_path / "nested.toml"
    nested.write_text(
        spec.read_text()
        .replace(f'name = "{name}"', 'name = "nested"')
        .replace(f'segment_store = "{tmp_path / "store"}"', f'segment_store = "{tmp_path}/store/{name}"')
    )
    assert_one_line_error(ingest(env, "source", "apply", str(nested)), 2, "'nested'", f"'{name}'", "overlaps")
    hashed = tmp_path / "hashed.toml"
    hashed.write_text(
        spec.read_text().replace(f'segment_store = "{tmp_path / "store"}"', f'segment_store = "{tmp_path}/store#1"')
    )
    assert_one_line_error(ingest(env, "source", "apply", str(hashed)), 2, "segment_store", "'#'")
    grouped = tmp_path / "grouped.toml"
    taken_group = f'name = "grouped"\nconsumer_group = "ingest-{name}"'
    grouped.write_text(
        nested.read_text()
        .replace('name = "nested"', taken_group)
        .replace(f"{tmp_path}/store/{name}", f"{tmp_path}/other-store")
    )
    assert_one_line_error(ingest(env, "source", "apply", str(grouped)), 2, "consumer_group", f"'{name}'")
    no_kafka = {**env, "INGEST_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    assert_one_line_error(ingest(no_kafka, "worker", name), 4, "Kafka unreachable")


def test_a_worker_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> None:
    env = process_env(database_url, kafka_bootstrap)
    name, spec = write_spec(tmp_path, make_topic(partitions=1))
    apply_spec(database_url, spec)
    # Spark cannot start (no Java here): named, with the master, before the worker joins.
    no_java = {**env, "JAVA_HOME": str(tmp_path / "no-java"), "INGEST_METRICS_PORT": "0"}
    assert_one_line_error(ingest(no_java, "worker", name), 1, "could not start Spark", "INGEST_SPARK_MASTER=")
    # The metrics port is taken: fails at once, before Spark starts, naming the address.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = {**env, "INGEST_METRICS_PORT": str(port)}
        result = ingest(busy, "worker", name, timeout=30)
    assert_one_line_error(result, 2, f"metrics endpoint 127.0.0.1:{port}", "INGEST_METRICS_PORT")
    assert "spark_warmed_up" not in result.stdout + result.stderr
    # A librdkafka property it refuses, consumer-only or not: named at once, before Spark starts;
    # `ingest status` (which asks Kafka for watermarks) says the same.
    for prop, value in (
        ("INGEST_KAFKA_PROP_MAX_POL_INTERVAL_MS", "1000"),
        ("INGEST_KAFKA_PROP_SOCKET_TIMEOUT_MS", "soon"),
    ):
        typo = {**env, prop: value, "INGEST_METRICS_PORT": "0"}
        result = ingest(typo, "worker", name, timeout=30)
        librdkafka_name = prop.removeprefix("INGEST_KAFKA_PROP_").lower().replace("_", ".")
        assert_one_line_error(result, 2, "INGEST_KAFKA_PROP_", librdkafka_name)
        assert "spark_warmed_up" not in result.stdout + result.stderr
    assert_one_line_error(ingest(typo, "status", name), 2, "socket.timeout.ms")
    # The schema lacks this release's newest migration (`ingest migrate` was not run): the
    # worker refuses to start rather than fail at its first publish.
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT max(migration_id) FROM _yoyo_migration").fetchone()
        assert row is not None
        conn.execute("DELETE FROM _yoyo_migration WHERE migration_id = %s", (row[0],))
    assert_one_line_error(ingest(env, "worker", name), 8, row[0], "ingest migrate")


def test_segments_status_and_gc(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(2, max_records=300)
    produced.produce(1000)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to catch up")
    worker.stop()
    env = process_env(database_url, kafka_bootstrap)

    listed = json.loads(ingest(env, "segments", source, "--json").stdout)
    assert listed["schema_version"] == 1 and listed["source"] == source
    segments = listed["segments"]
    assert sum(s["rows"] for s in segments) == 1000
    ranges = sorted((r["partition"], r["start"], r["end"]) for s in segments for r in s["ranges"])
    for p in (0, 1):
        mine = [(start, end) for part, start, end in ranges if part == p]
        assert mine[0][0] == 0 and mine[-1][1] == produced.ends[p]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
    assert f"{len(segments)} segment(s), 1000 row(s)" in ingest(env, "segments", source).stdout

    status = json.loads(ingest(env, "status", source, "--json").stdout)
    assert {p["partition"]: p["next_offset"] for p in status["partitions"]} == produced.ends
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "NO_WORKERS")  # the worker stopped
    assert all(p["last_event_time"] for p in status["partitions"])
    assert ingest(env, "health", source).returncode == 1
    assert all(p["serial"] == 1 and p["lag"] is not None and p["lag"] >= 0 for p in status["partitions"])
    assert source in ingest(env, "status", source).stdout

    # Files no build registered are never gc's to delete, whatever their age.
    orphan = tmp_path / "store" / source / "segments" / str(uuid.uuid4())
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"not published")
    dry = ingest(env, "gc", source, "--grace", "0", "--dry-run")
    assert dry.returncode == 0 and "would delete 0 file(s)" in dry.stdout, dry.stdout
    assert "0 split(s)" in ingest(env, "gc", source).stdout  # the default grace abandons nothing young
    # A grace that abandons splits running workers still build needs --force.
    assert_one_line_error(ingest(env, "gc", source, "--grace", "0"), 2, "--grace 0", "--force")
    assert_one_line_error(ingest(env, "gc", source, "--grace", "nan", "--force"), 2, "--grace")
    assert_one_line_error(ingest(env, "gc", "no-such-source", "--force"), 3, "no-such-source")
    result = ingest(env, "gc", source, "--grace", "0", "--force")
    assert result.returncode == 0 and "0 build(s) wait for splits still building" in result.stdout, result.stdout
    assert orphan.exists()
    assert_exactly_once(database_url, source, produced)  # every published file is still there


def test_gc_during_a_delayed_publish_loses_nothing(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    """A publish held up after its build (as by a metastore outage) while gc runs with a
    grace shorter than the hold-up: gc abandons the split and deletes its files, the late
    publish is refused and counted as a conflict, the worker reads the records again and
    every record is published exactly once, with every published file in place."""
    source, produced = new_source(1, max_records=250)
    produced.produce(1000)
    env = process_env(database_url, kafka_bootstrap)
    worker = start_worker(settings(database_url, kafka_bootstrap, fault_publish_delay_s=3.0), source, spark_builder)
    metrics = worker.worker.metrics
    wait_until(
        lambda: (
            metrics.inflight_splits.labels(source)._value.get() > 0
            and metrics.segments_published.labels(source)._value.get() == 0
        ),
        60,
        "a built split held up",
    )
    time.sleep(1.0)  # built, waiting to publish
    result = ingest(env, "gc", source, "--grace", "0", "--force")
    assert result.returncode == 0 and "abandoned 0 " not in result.stdout, result.stdout
    wait_until(
        lambda: metrics.publish_conflicts.labels(source, "abandoned")._value.get() >= 1,
        30,
        "the late publish to be refused",
    )
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 120, "the worker to read the records again")
        assert store.conflict_counts(source).get("abandoned", 0) >= 1
    worker.stop()
    assert worker.error is None
    assert_exactly_once(database_url, source, produced)  # reads every published file


def test_a_stale_migration_lock_is_one_line_and_break_lock_clears_it(database_url: str, kafka_bootstrap: str) -> None:
    env = process_env(database_url, kafka_bootstrap)
    # What a migrate killed while holding yoyo's lock leaves behind.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO yoyo_lock (locked, ctime, pid) VALUES (1, now(), 4242)")
    assert_one_line_error(ingest(env, "migrate"), 1, "migration lock is held", "4242", "--break-lock")
    result = ingest(env, "migrate", "--break-lock")
    assert result.returncode == 0 and "already up to date" in result.stdout, result.stderr


def test_drain_and_terminate_wait_visibly_and_nothing_undoes_a_terminate(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
) -> None:
    env = process_env(database_url, kafka_bootstrap)
    name, spec = write_spec(tmp_path, "t-" + uuid.uuid4().hex[:6])
    apply_spec(database_url, spec)
    for bad in ("0", "-5", "nan", "inf", "soon"):
        assert_one_line_error(ingest(env, "drain", name, "--timeout", bad), 2, "--timeout")
    for flag, bad in (("--since", "yesterday"), ("--since", "-5m"), ("--limit", "0"), ("--limit", "ten")):
        assert_one_line_error(ingest(env, "segments", name, f"{flag}={bad}"), 2, flag)
    listed = ingest(env, "segments", name, "--since", "30m", "--limit", "5", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["segments"] == [], listed.stderr
    # Every command that prints has --json: one document with a schema_version on stdout.
    for argv in (
        ["migrate"],
        ["source", "apply", str(spec)],
        ["source", "list"],
        ["source", "history", name],
        ["suspend", name],
        ["resume", name],
        ["gc", name, "--dry-run"],
        ["gaps", "list", name],
        ["gaps", "ack", name, "--all"],
        ["health", name],
        ["status", name],
    ):
        result = ingest(env, *argv, "--json")
        assert result.returncode == 0, (argv, result.stderr)
        assert json.loads(result.stdout)["schema_version"] == 1, (argv, result.stdout)
    assert_one_line_error(ingest(env, "terminate", name, "--timeout", "nan"), 2, "--timeout")
    with Metastore(database_url) as store:
        store.heartbeat(name, "w-busy", "host-1", 1, "test", "running", [])
    # A worker that does not drain: the wait says whom it waits for, then times out in one line.
    result = ingest(env, "drain", name, "--timeout", "7", timeout=60)
    assert "waiting for 1 worker(s): w-busy (running)" in result.stdout, result.stdout
    assert_one_line_error(result, 1, "timed out after 7 s", "w-busy")

    proc = popen(
        [sys.executable, "-m", "ingest", "terminate", name, "--timeout", "60"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: store.control(name).desired_state == "terminating", 30, "terminate to begin")
        # While terminating, no other control applies (each would undo the drain).
        for command in ("suspend", "resume", "drain"):
            assert_one_line_error(ingest(env, command, name), 9, "being terminated")
        with psycopg.connect(database_url, autocommit=True) as conn:  # as a release without that guard would
            conn.execute("UPDATE ingest_sources SET desired_state = 'running' WHERE name = %s", (name,))
        with Metastore(database_url) as store:
            store.heartbeat(name, "w-busy", "host-1", 1, "test", "drained", [])
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "was not terminated" in err and "running" in err, (out, err)
    assert "terminated (" not in out
