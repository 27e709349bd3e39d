"""The long-running compactor role (ingest.compact.runner) against a real PostgreSQL: one
active compactor per source, the others standing by until it goes; outages ridden out; a pass
stuck in a Spark job past its deadline interrupted, its lock taken over by a standby."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from ingest.compact.job import CompactionResult, Compactor
from ingest.compact.metrics import CompactionMetrics
from ingest.compact.runner import compactor_health, run_compactor
from ingest.roles.health import RoleState
from ingest.spark.session import FixedSession
from ingest.spec.parse import spec_from_dict
from ingest_dev.testkit import wait_until
from metastore import Metastore, MetastoreUnavailable
from tests.integration.iceberg_harness import Source


class Counting(Compactor):
    """A compactor that counts its passes (the source has nothing to compact: no Spark)."""

    def __init__(self, store: Metastore, fail_first: int = 0) -> None:
        super().__init__(store, self._no_spark, "c")
        self.passes = 0
        self.fail_first = fail_first

    @staticmethod
    def _no_spark(_spec: Any) -> Any:
        raise AssertionError("nothing to compact: no Spark job")

    def run(self, source: str, *args: Any, **kwargs: Any) -> CompactionResult:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise MetastoreUnavailable("injected outage")
        self.passes += 1
        return super().run(source, *args, **kwargs)


class Role:
    def __init__(self, database_url: str, fail_first: int = 0) -> None:
        self.store = Metastore(database_url)
        self.compactor = Counting(self.store, fail_first)
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=run_compactor, args=(self.compactor, self.store, "src", 0.1, self.stop), daemon=True
        )
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.store.close()


def test_one_compactor_per_source_is_active_and_a_standby_takes_over(database_url: str) -> None:
    with Metastore(database_url) as setup:
        spec = spec_from_dict(
            {"name": "src", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": "/r"}
        )
        setup.apply_source("src", spec.to_json(), "")
    first = Role(database_url, fail_first=2)  # two failed passes first: retried, not the end
    wait_until(lambda: first.compactor.passes >= 2, 30, "the first compactor to pass twice")
    second = Role(database_url)
    try:
        with Metastore(database_url) as other:
            assert not other.try_compact_lock("src")  # held by the active one
        wait_until(lambda: first.compactor.passes >= 5, 30, "more passes of the active compactor")
        assert second.compactor.passes == 0 and second.thread.is_alive()
        first.end()  # its lock goes with its connection
        wait_until(lambda: second.compactor.passes >= 1, 30, "the standby to take over")
    finally:
        second.end()
        if first.thread.is_alive():
            first.end()
    with Metastore(database_url) as other:
        assert other.try_compact_lock("src")  # released at the end of the role


class StuckInSpark(Compactor):
    """A compactor whose chunk's Spark job (tagged as every compaction job is) would run for two
    minutes: a job stuck on a store or an executor. ``on_interrupt``: what the test looks at
    when the role asks it to stop (the job still runs then)."""

    def __init__(self, store: Metastore, spark: Any, on_interrupt: Any) -> None:
        super().__init__(store, lambda _spec: FixedSession(spark), "c1")
        self.on_interrupt = on_interrupt

    def interrupt(self) -> None:
        self.on_interrupt()
        super().interrupt()

    def _spark_rewrite(self, spark: Any, *_args: Any) -> Any:
        from pyspark.sql.functions import udf

        stuck = udf(lambda v: time.sleep(120) or v, "long")
        spark.range(1).select(stuck("id")).collect()
        raise AssertionError("the stuck job ended on its own")


def test_a_pass_stuck_in_a_spark_job_past_its_deadline_is_interrupted_and_a_standby_takes_over(
    database_url: str, tmp_path: Path, spark: Any
) -> None:
    src = Source(database_url, f"file://{tmp_path}/store")
    for _ in range(3):
        src.publish(5)
    stores = [Metastore(database_url), Metastore(database_url)]
    healths = [compactor_health(src.name, 0.1, pass_deadline_s=2.0), compactor_health(src.name, 0.1)]
    # What /healthz said, and whether the lock was free, when the role gave up on the stuck pass.
    seen: list[tuple[tuple[bool, str], bool]] = []

    def looked() -> None:
        with Metastore(database_url) as other:
            free = other.try_compact_lock(src.name)
        seen.append((healths[0].healthy(), free))

    compactors = [StuckInSpark(stores[0], spark, looked), Compactor(stores[1], lambda _spec: FixedSession(spark), "c2")]
    metrics = [CompactionMetrics(src.name), CompactionMetrics(src.name)]
    stops = [threading.Event(), threading.Event()]
    threads: list[threading.Thread] = []

    def start(i: int) -> None:
        args = (compactors[i], stores[i], src.name, 0.1, stops[i], None, metrics[i], healths[i])
        threads.append(threading.Thread(target=run_compactor, args=args, daemon=True))
        threads[-1].start()

    def failures(i: int) -> float:
        return metrics[i].failures.labels(src.name)._value.get()

    try:
        with capture_logs() as logs:
            start(0)
            wait_until(lambda: healths[0].state is RoleState.ACTIVE, 30, "the stuck compactor to be active")
            start(1)
            wait_until(lambda: healths[1].state is RoleState.STANDBY, 30, "the other to stand by")
            # Past the deadline: /healthz says why, the lock is free, and the job is interrupted
            # (it would run two minutes): the pass returns, a failed pass, retried.
            wait_until(lambda: failures(0) == 1, 20, "the stuck job to be interrupted")
            [((ok, reason), free)] = seen
            assert not ok and reason.startswith("overrun: a pass went "), reason
            assert reason.endswith(
                "without a chunk ending, past its deadline of 2 s (INGEST_COMPACT_PASS_DEADLINE_S); "
                "it was asked to stop and the lock released"
            ), reason
            assert free
            ok, reason = healths[0].healthy()
            assert ok and "retrying: 1 pass(es) failed in a row" in reason and "ran past its deadline" in reason
            # The standby takes the lock and compacts what the stuck pass had chosen.
            wait_until(lambda: healths[1].ready() == (True, "active"), 30, "the standby to take over")
            wait_until(lambda: len(src.store.segments(src.name)) == 1, 60, "the standby's compaction")
            wait_until(lambda: healths[0].healthy() == (True, "standby"), 30, "the first compactor to stand by")
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(30)
        spark.sparkContext.cancelAllJobs()  # a stuck job left by a failed run of this test
        for store in stores:
            store.close()
        src.store.close()
    assert not any(thread.is_alive() for thread in threads)
    said = [e for e in logs if e["event"] in ("compaction_past_deadline", "compaction_retry")]
    assert [e["event"] for e in said] == ["compaction_past_deadline", "compaction_retry"], said
    assert said[1]["error"].startswith(
        "a pass ran past its deadline of 2 s (INGEST_COMPACT_PASS_DEADLINE_S) and was asked to stop: "
    ), said
    assert failures(0) == 1 and failures(1) == 0
