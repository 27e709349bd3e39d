"""The long-running compactor role (ingest.compact.runner) against a real PostgreSQL: one
active compactor per source, the others standing by until it goes; outages ridden out."""

from __future__ import annotations

import threading
from typing import Any

from ingest.compact.job import CompactionResult, Compactor
from ingest.compact.runner import run_compactor
from ingest.spec import spec_from_dict
from ingest_dev.testkit import wait_until
from metastore import Metastore, MetastoreUnavailable


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
