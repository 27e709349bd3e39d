"""A publish that does not finish makes the worker's /healthz unhealthy, with the reason, and
a log event when it passes the bound and when it ends (the loop against in-memory fakes)."""

from __future__ import annotations

import threading

from structlog.testing import capture_logs

from ingest.config import Settings
from ingest.worker import Worker
from ingest_common.model import SegmentToPublish
from tests.fake_metastore import MemoryMetastore
from tests.loop_harness import P0, Harness


class StuckStore(MemoryMetastore):
    """Publishes wait until ``release`` is set (bounded: a test never hangs)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def publish(self, item: SegmentToPublish) -> int:
        self.release.wait(30)
        return super().publish(item)


def test_a_publish_stuck_past_the_bound_makes_the_worker_unhealthy_until_it_finishes() -> None:
    store = StuckStore()
    h = Harness(store=store, publish_stall_s=0.3)
    worker = Worker(Settings(database_url="postgresql://unused", kafka_bootstrap="unused"), "src")
    worker.loop = h.loop
    try:
        with capture_logs() as logs:
            h.produce(P0, 10)
            h.consumer.group_assigns(P0)
            h.step_until(lambda: h.publishes.publishing is not None, what="the publish to start")
            assert worker.healthy()[0]  # within the bound
            h.step_until(lambda: not worker.healthy()[0], what="the worker to turn unhealthy")
            ok, reason = worker.healthy()
            assert not ok and "publish of t[0] [0, 10) unfinished after" in reason and "bound 0.3s" in reason
            # The loop keeps polling (the registry state stays as it was: only /healthz says it).
            store.release.set()
            h.step_until(lambda: h.published(P0) == [(0, 10)], what="the publish to finish")
            assert worker.healthy()[0]
            h.step_until(lambda: any(e["event"] == "publish_stall_ended" for e in logs), what="the end logged")
        stalls = [e for e in logs if e["event"] in ("publish_stalled", "publish_stall_ended")]
        assert [e["event"] for e in stalls] == ["publish_stalled", "publish_stall_ended"], stalls
        assert stalls[0]["partition"] == 0 and "unfinished" in stalls[0]["reason"]
    finally:
        store.release.set()
        h.close()
