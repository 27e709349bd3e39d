"""A pattern source's partitions of a deleted topic (migrations/0024), against a real PostgreSQL."""

from __future__ import annotations

from ingest_common.model import TopicPartition
from metastore import Metastore

GONE = [TopicPartition("orders.gone", 0), TopicPartition("orders.gone", 1)]


def test_a_deleted_topic_is_retired_once_claimed_fenced_and_live_again_after_a_reset(database_url: str) -> None:
    with Metastore(database_url) as store:
        store.apply_source("src", {"name": "src"}, "name = 'src'")
        store.register_partitions("src", "orders.gone", [0, 1], "latest")
        store.register_partitions("src", "orders.live", [0], "latest")
        claims = store.claim_from("src", "w1", GONE, 7)
        assert {c.next_offset for c in claims.values()} == {7} and not any(c.retired for c in claims.values())
        assert store.live_topics("src") == ["orders.gone", "orders.live"]

        assert store.retire_topic("src", "orders.gone") == [0, 1]
        assert store.retire_topic("src", "orders.gone") == []  # idempotent: any worker may find it gone
        assert store.live_topics("src") == ["orders.live"]
        rows = {(r["topic"], r["partition"]): r for r in store.partitions("src")}
        assert rows[("orders.gone", 0)]["retired_at"] is not None and rows[("orders.gone", 0)]["owner"] is None
        assert rows[("orders.live", 0)]["retired_at"] is None

        # A topic re-created under the name: its partitions are claimed as retired (the worker
        # fences them), their stored offsets untouched.
        again = store.claim_partitions("src", "w2", GONE)
        assert all(c.retired and c.next_offset == 7 for c in again.values())

        # A reset puts them in a new epoch, live again.
        store.reset_offsets("src", dict.fromkeys(GONE, 0), actor="t", reason="re-created", target="0", confirmed=True)
        assert store.live_topics("src") == ["orders.gone", "orders.live"]
        after = store.claim_partitions("src", "w2", GONE)
        assert all(not c.retired and c.next_offset == 0 for c in after.values())
