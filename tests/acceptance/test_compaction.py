"""Compaction end to end: real broker, PostgreSQL and Spark. Small segments published by a
worker are rewritten and replaced; every record stays in exactly one current segment's files,
whatever runs beside the compactor or stops it half-way."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ingest.builder.job import BuilderFactory
from ingest.compact.job import Compactor
from ingest.ops.gc import collect_garbage
from ingest.roles.runner import STOP_GRACE_S
from ingest.segments import store as segment_store
from ingest.spark.session import FixedSession
from ingest.table.catalog import MetastoreCatalog, identifier
from ingest_common.model import TopicPartition
from ingest_dev.process import popen
from ingest_dev.testkit import free_port, wait_until
from ingest_dev.verify import verify_epochs
from metastore import Metastore, ReplaceRefused
from metastore.tables import TableKind
from tests.acceptance.harness import (
    REPO,
    NewSource,
    Produced,
    StartWorker,
    assert_exactly_once,
    process_env,
    settings,
)
from tests.acceptance.test_audit import audit
from tests.acceptance.test_cli import ingest

TARGET = 64 * 1024**2


class Interrupted(BaseException):
    """A compactor killed where the hook raises it: nothing of it runs after (no cleanup)."""


class HookedStore(Metastore):
    """A metastore whose ``replace_segments`` runs ``before_replace`` first: what happens
    between a compaction's Spark job and its replacement."""

    before_replace: Callable[[], None] = staticmethod(lambda: None)

    def replace_segments(self, *args: Any, **kwargs: Any) -> int:
        self.before_replace()
        return super().replace_segments(*args, **kwargs)


def read_until(proc: subprocess.Popen[str], event: str, timeout_s: float = 600) -> list[str]:
    """Read the process's log until ``event`` (or its exit, or ``timeout_s``: then it is
    killed); returns the lines read."""
    assert proc.stderr is not None
    deadline = threading.Timer(timeout_s, proc.kill)
    deadline.start()
    seen: list[str] = []
    try:
        for line in proc.stderr:  # ends when the process does (killed at the deadline at the latest)
            seen.append(line)
            if event in line:
                break
    finally:
        deadline.cancel()
    return seen


def killed_at_pause(proc: subprocess.Popen[str], event: str, timeout_s: float = 600) -> list[str]:
    """Read the process's log until ``event`` (or its exit, or ``timeout_s``), then SIGKILL it;
    returns the lines read."""
    try:
        return read_until(proc, event, timeout_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def value(i: int) -> bytes:
    from tests.acceptance.harness import sample_value

    return b"{not json" if i % 997 == 0 else sample_value(i)


def publish_small_segments(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, records: int = 6000,
) -> tuple[str, Produced, Any]:  # fmt: skip
    """A source cut into many small segments (file_partition hour), its records published; the
    worker keeps running."""
    source, produced = new_source(3, max_records=400, max_age="1s", extra='file_partition = "hour"')
    produced.produce(records, value)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to publish everything")
    return source, produced, worker


def compactor(store: Metastore, spark: Any) -> Compactor:
    # The session's shared Spark: never stopped here (Compactor.stop is not called).
    return Compactor(store, lambda _spec: FixedSession(spark), "compact-test")


def data_files(store: Metastore, source: str) -> list[str]:
    return [f for s in store.segments(source) for f in s["files"]]


def test_compaction_beside_a_running_worker_keeps_every_record_once(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, spark: Any,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker
    )
    with Metastore(database_url) as store:
        before = store.segments(source)
        files_before = data_files(store, source)
        produced.produce(3000, value)  # the worker publishes while the compactor runs
        result = compactor(store, spark).run(source, TARGET)
        assert result.replaced and not result.refused
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to publish the rest")
        worker.stop()
        assert worker.error is None
        after = store.segments(source)
        listed = {s["id"] for s in after}
        replaced = {i for r in result.replaced for i in r.replaced}
        # ingest segments lists the new segments, none of those they replaced.
        assert not listed & replaced and {r.segment_id for r in result.replaced} <= listed
        assert len(after) < len(before)
        compacted = [f for r in result.replaced for s in after if s["id"] == r.segment_id for f in s["files"]]
        assert len(compacted) < len(files_before) / 2 and all("/ingest-part=" in f for f in compacted)
        for uri in compacted:
            fs, path = segment_store.filesystem(uri)
            offsets = pq.read_table(path, columns=["_offset"], filesystem=fs)["_offset"].to_pylist()
            assert offsets == sorted(offsets)
    verified = assert_exactly_once(database_url, source, produced)
    assert verified.rejects == len([i for i in range(9000) if i % 997 == 0])


def test_a_zombie_compactor_is_refused_and_a_killed_one_leaves_nothing_visible(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, spark: Any,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker
    )
    worker.stop()
    with HookedStore(database_url) as store:
        spec, chunks = compactor(store, spark).plan(source, TARGET)
        assert len(chunks) >= 2
        listed = store.segments(source)

        # Killed between its registration and its replacement: nothing visible changes.
        def killed() -> None:
            raise Interrupted

        store.before_replace = killed
        with pytest.raises(Interrupted):
            compactor(store, spark).compact(spec, spec, chunks[0])
        store.before_replace = lambda: None
        assert store.segments(source) == listed
        gc = collect_garbage(store, source, grace_s=0)
        assert gc.abandoned == 1 and gc.deleted and all("/segments/" in f for f in gc.deleted)
        assert_exactly_once(database_url, source, produced)

        # Two compactors chose the same segments: the one that comes second is refused.
        first = compactor(store, spark).compact(spec, spec, chunks[1])
        with pytest.raises(ReplaceRefused) as refused:
            compactor(store, spark).compact(spec, spec, chunks[1])
        assert refused.value.reason == "replaced"
        assert first.segment_id in {s["id"] for s in store.segments(source)}
    assert_exactly_once(database_url, source, produced)


def test_gc_during_compaction_abandons_it_and_nothing_is_lost(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, spark: Any,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker, records=3000
    )
    worker.stop()
    with HookedStore(database_url) as store:
        spec, chunks = compactor(store, spark).plan(source, TARGET)
        files = data_files(store, source)
        swept: list[Any] = []
        # gc with no grace runs after the compaction wrote its files, before it replaces.
        store.before_replace = lambda: swept.append(collect_garbage(store, source, grace_s=0))
        with pytest.raises(ReplaceRefused) as refused:
            compactor(store, spark).compact(spec, spec, chunks[0])
        assert refused.value.reason == "abandoned" and swept[0].abandoned == 1
        assert data_files(store, source) == files and all(_exists(f) for f in files)
        # A later gc with a grace deletes nothing a current segment lists.
        store.before_replace = lambda: None
        collect_garbage(store, source, grace_s=0)
        assert all(_exists(f) for f in files)
    assert_exactly_once(database_url, source, produced)


def test_a_reset_during_compaction_leaves_each_epoch_exactly_once(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, spark: Any,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker, records=3000
    )
    tps = [TopicPartition(produced.topic, p) for p in range(3)]
    with HookedStore(database_url) as store:
        # Replay everything while the compaction runs: the running worker publishes it again in
        # a new epoch; the replacement keeps the old epoch's offsets where they were.
        def reset() -> None:
            store.reset_offsets(source, {tp: 0 for tp in tps}, actor="t", reason="replay", target="0", confirmed=True)

        store.before_replace = reset
        result = compactor(store, spark).run(source, TARGET, max_chunks=1)
        assert len(result.replaced) == 1
        store.before_replace = lambda: None
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to publish the replay")
        worker.stop()
        assert worker.error is None
        ends = {(produced.topic, p): end for p, end in produced.ends.items()}
        verified = verify_epochs(store, source, ends)
        assert verified.ok, verified.summary()
        # Compacting again after the reset: each epoch's segments are compacted on their own.
        again = compactor(store, spark).run(source, TARGET)
        assert again.replaced and not again.refused
        verified = verify_epochs(store, source, ends)
        assert verified.ok, verified.summary()


def _exists(uri: str) -> bool:
    fs, path = segment_store.filesystem(uri)
    return bool(fs.get_file_info(path).size)


def test_a_table_fed_source_follows_compaction_once_through_a_killed_committer(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker, spark: Any,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker, records=3000
    )
    worker.stop()
    assert worker.error is None
    env = process_env(database_url, kafka_bootstrap)
    assert ingest(env, "table-enable", source).returncode == 0
    committed = ingest(env, "table-commit", source, "--once", timeout=180)
    assert committed.returncode == 0, committed.stdout + committed.stderr
    with Metastore(database_url) as store:
        result = compactor(store, spark).run(source, TARGET)
    assert len(result.replaced) >= 2 and not result.refused
    # The table still holds the replaced segments' files until the committer follows: no finding.
    code, lines, _ = audit(env, source)
    assert code == 0, lines

    # A committer killed right after its first Iceberg commit (a replacement), recorded in the swap.
    fault = {**env, "INGEST_FAULT_TABLE_PAUSE_AT": "iceberg_committed"}
    proc = popen(
        [sys.executable, "-m", "ingest", "table-commit", source, "--interval", "0"],
        env=fault, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert any("table_fault_pause" in line for line in killed_at_pause(proc, "table_fault_pause"))
    once = ingest(env, "table-commit", source, "--once", timeout=180)
    assert once.returncode == 0, once.stdout + once.stderr

    catalog = MetastoreCatalog(database_url)
    try:
        table = catalog.load_table(identifier(source, TableKind.DATA))
        rows = table.scan(selected_fields=("_partition", "_offset")).to_arrow()
        summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    finally:
        catalog.close()
    # Every replacement is one overwrite snapshot, none made twice (the killed one's included).
    overwrites = [s for s in summaries if s.get("ingest.replacement") is not None]
    assert sorted(int(str(s.get("ingest.replacement"))) for s in overwrites) == sorted(
        r.segment_id for r in result.replaced
    )
    assert {s.operation.value for s in overwrites} == {"overwrite"}
    # Read back: every published record once, each partition's records exactly the published ones.
    held = Counter(zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True))
    assert max(held.values()) == 1
    verified = assert_exactly_once(database_url, source, produced)
    expected = {(p, o) for p, end in produced.ends.items() for o in range(end) if (o * 3 + p) % 997 != 0}
    assert len(held) == verified.rows and set(held) == expected
    code, lines, doc = audit(env, source)
    assert code == 0 and doc["tables"] == ["data", "rejects"], lines


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(port: int, name: str) -> list[float]:
    """The values of the metric ``name`` (any labels) that the process serves now."""
    _status, body = probe(port, "/metrics")
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{")]


def test_a_compactor_process_killed_or_stopped_mid_job_leaves_nothing_visible_and_the_role_exports_metrics(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, new_source: NewSource, spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:  # fmt: skip
    source, produced, worker = publish_small_segments(
        tmp_path, database_url, kafka_bootstrap, new_source, spark_builder, start_worker, records=3000
    )
    worker.stop()
    assert worker.error is None
    env = process_env(database_url, kafka_bootstrap, INGEST_METRICS_HOST="127.0.0.1")
    with Metastore(database_url) as store:
        listed = store.segments(source)

    # SIGKILL after the build is registered and its files written, before the replacement.
    role = [sys.executable, "-m", "ingest", "compact", source, "--every", "600", "--target-size", "64MiB"]
    fault = {**env, "INGEST_FAULT_COMPACT_PAUSE_AT": "rewritten", "INGEST_METRICS_PORT": "0"}
    proc = popen(role, env=fault, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = killed_at_pause(proc, "compaction_fault_pause")
    assert any("compaction_fault_pause" in line for line in seen), "".join(seen[-20:])
    with Metastore(database_url) as store:
        assert store.segments(source) == listed  # nothing visible
        swept = collect_garbage(store, source, grace_s=0)
        assert swept.abandoned == 1 and swept.deleted and all("/segments/" in f for f in swept.deleted)
        assert all(_exists(f) for s in listed for f in s["files"])
    code, lines, _ = audit(env, source)
    assert code == 0, lines

    # SIGTERM at the same point: the pass is asked to stop, does not (it waits for its kill),
    # and the role leaves it after its grace; the process exits 0 with nothing visible.
    proc = popen(role, env=fault, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = read_until(proc, "compaction_fault_pause")
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a failed stop must not outlive the test
    took = time.monotonic() - stopped_at
    assert proc.returncode == 0, err[-2000:]
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 30, took
    with Metastore(database_url) as store:
        assert store.segments(source) == listed
        assert collect_garbage(store, source, grace_s=0).abandoned == 1
    assert any("compaction_fault_pause" in line for line in seen)

    # The role again, without the fault: it compacts and serves its metrics and health.
    port = free_port()
    proc = popen(
        role, env={**env, "INGEST_METRICS_PORT": str(port)}, cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        replaced: list[float] = []
        for _ in range(1800):  # bounded: 0.1 s per attempt while the process lives
            try:
                replaced = samples(port, "ingest_compaction_segments_compacted_total")
            except OSError:
                replaced = []
            if (replaced and replaced[0] > 0) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert replaced and replaced[0] > 0, replaced
        assert probe(port, "/readyz") == (200, "active\n")
        assert probe(port, "/healthz") == (200, "active\n")
        assert samples(port, "ingest_compactor_active") == [1.0]
        assert samples(port, "ingest_compaction_replacements_total")[0] >= 2
        with Metastore(database_url) as store:
            current = store.segments(source)
        assert samples(port, "ingest_segments_current") == [float(len(current))]
        assert samples(port, "ingest_segment_files") == [float(sum(len(s["files"]) for s in current))]
        assert samples(port, "ingest_segment_file_median_bytes")[0] > 0
        assert samples(port, "ingest_compaction_segments_pending") == [0.0]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert len(current) < len(listed)
    assert_exactly_once(database_url, source, produced)
    code, lines, _ = audit(env, source)
    assert code == 0, lines
