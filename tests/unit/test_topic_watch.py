"""A pattern source's topic watch: new topics registered with start_from, deleted ones retired."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from ingest.consume.background import Background
from ingest.consume.kafka import KafkaCallFailed
from ingest.consume.topic_watch import TopicWatch
from ingest_common.model import StartFrom


class Store:
    def __init__(self, live: Iterable[str] = ()) -> None:
        self.rows: dict[str, list[int]] = {t: [0] for t in live}
        self.registered: list[tuple[str, list[int], StartFrom]] = []
        self.retired: list[str] = []

    def register_partitions(
        self, source: str, topic: str, partitions: Iterable[int], initial_position: StartFrom
    ) -> None:
        self.registered.append((topic, list(partitions), initial_position))
        self.rows.setdefault(topic, list(partitions))

    def retire_topic(self, source: str, topic: str) -> list[int]:
        if topic in self.retired:
            return []
        self.retired.append(topic)
        return self.rows[topic]

    def live_topics(self, source: str) -> list[str]:
        return sorted(t for t in self.rows if t not in self.retired)


class Cluster:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.down = False

    def __call__(self, timeout_s: float) -> dict[str, int]:
        if self.down:
            raise KafkaCallFailed("the cluster's topics: no answer")
        return dict(self.topics)


@pytest.fixture
def background() -> Iterable[Background]:
    bg = Background("test-topic-watch")
    yield bg
    bg.close()


def watch(store: Store, cluster: Cluster, background: Background, registered: Iterable[str] = ()) -> TopicWatch:
    return TopicWatch(
        source="s",
        start_from="latest",
        metadata=cluster,
        claims=store,
        store=store,
        background=background,
        interval_s=1.0,
        registered=registered,
    )


def test_a_topic_first_assigned_has_all_its_partitions_registered_with_start_from_once(background: Background) -> None:
    store, cluster = Store(["orders.a"]), Cluster({"orders.a": 2, "orders.b": 3})
    topics = watch(store, cluster, background, registered=["orders.a"])
    assert topics.register_new(["orders.a", "orders.b"], 1.0) == ["orders.b"]
    assert store.registered == [("orders.b", [0, 1, 2], "latest")]
    assert topics.register_new(["orders.b"], 1.0) == []
    assert len(store.registered) == 1
    cluster.down = True
    with pytest.raises(KafkaCallFailed):
        topics.register_new(["orders.c"], 1.0)


def pass_(topics: TopicWatch, background: Background, now: float) -> None:
    topics.due(now)
    assert background.wait(5.0)


def test_a_topic_is_retired_once_two_metadata_answers_in_a_row_miss_it(background: Background) -> None:
    store, cluster = Store(["orders.a", "orders.b"]), Cluster({"orders.a": 1, "orders.b": 1})
    topics = watch(store, cluster, background, registered=["orders.a", "orders.b"])
    pass_(topics, background, 0.0)
    del cluster.topics["orders.a"]
    pass_(topics, background, 0.5)  # not due yet: nothing asked
    pass_(topics, background, 1.0)  # the first answer without it
    assert store.retired == []
    cluster.down = True
    pass_(topics, background, 2.0)  # no answer: nothing is concluded
    assert store.retired == []
    cluster.down = False
    pass_(topics, background, 3.0)
    assert store.retired == ["orders.a"]
    pass_(topics, background, 4.0)
    pass_(topics, background, 5.0)
    assert store.retired == ["orders.a"]
    # Back (re-created): registered again when assigned (rows that exist are left alone).
    cluster.topics["orders.a"] = 1
    assert topics.register_new(["orders.a"], 1.0) == ["orders.a"]


def test_a_topic_missing_from_one_answer_only_stays_live(background: Background) -> None:
    store, cluster = Store(["orders.a"]), Cluster({})
    topics = watch(store, cluster, background, registered=["orders.a"])
    pass_(topics, background, 0.0)
    cluster.topics["orders.a"] = 1
    pass_(topics, background, 1.0)
    del cluster.topics["orders.a"]
    pass_(topics, background, 2.0)
    assert store.retired == []
