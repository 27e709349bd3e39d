"""A pattern source's topics as they come and go (spec ``topic_pattern``).

The group member subscribes with the pattern; librdkafka asks the cluster's metadata every
``topic.metadata.refresh.interval.ms`` (INGEST_TOPIC_REFRESH_S) and the group rebalances when
the set of matching topics changed. So a new topic is consumed within that interval and a
rebalance, and a deleted one's partitions are revoked within the same bound. What this adds:

- a topic first assigned to this worker has the rows of all its partitions registered with the
  source's ``start_from`` before the claim (:meth:`TopicWatch.register_new`, in the assign
  callback): the workers sharing a new topic's partitions register the same rows (first one
  wins, the others' inserts do nothing), and a partition the claim finds without a row is one
  a known topic grew by (from earliest, as for listed topics);
- every interval, on the background thread, the topics with live rows that two metadata
  answers in a row no longer list are retired (migrations/0024): status shows their partitions
  RETIRED, their published ranges stay audited. Any worker of the group may retire a topic;
  retiring twice does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog
from confluent_kafka import KafkaException

from ingest.consume.background import Background
from ingest.consume.kafka import KafkaCallFailed, kafka_error_text
from ingest_common.model import StartFrom
from metastore.errors import MetastoreError

log = structlog.get_logger(__name__)

# Every topic in the cluster's metadata now (name -> partition count); KafkaCallFailed if no answer.
Metadata = Callable[[float], dict[str, int]]


def admin_metadata(admin: Any) -> Metadata:
    """:data:`Metadata` asked of an admin client (confluent-kafka's; safe from every thread):
    every topic the cluster lists, with an error or not (a topic being created or led
    elsewhere exists; a deleted one is not listed)."""

    def metadata(timeout_s: float) -> dict[str, int]:
        try:
            topics = admin.list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise KafkaCallFailed(f"the cluster's topics: {kafka_error_text(exc)}") from exc
        return {name: len(meta.partitions) for name, meta in topics.items()}

    return metadata


class TopicStore(Protocol):
    def register_partitions(
        self, source: str, topic: str, partitions: Iterable[int], initial_position: StartFrom
    ) -> None: ...
    def retire_topic(self, source: str, topic: str) -> list[int]: ...
    def live_topics(self, source: str) -> list[str]: ...


class TopicWatch:
    """Registers the topics this worker is first assigned, retires those deleted (polling
    thread; the retirement's calls run on the background thread)."""

    def __init__(
        self,
        *,
        source: str,
        start_from: StartFrom,
        metadata: Metadata,
        claims: TopicStore,
        store: TopicStore,
        background: Background,
        interval_s: float,
        registered: Iterable[str] = (),
    ) -> None:
        self._source = source
        self._start_from = start_from
        self._metadata = metadata
        self._claims = claims
        self._store = store
        self._background = background
        self._interval_s = interval_s
        # Topics whose rows exist (registered at start, or here).
        self._registered = set(registered)
        self._due = 0.0
        self._busy = False
        # Live topics the last metadata answer did not list: retired when the next one does not either.
        self._missing: set[str] = set()

    def register_new(self, topics: Iterable[str], timeout_s: float) -> list[str]:
        """Register every partition of each topic not registered yet with ``start_from`` (the
        assign callback's connection; rows that exist are left alone); the topics registered."""
        new = sorted(set(topics) - self._registered)
        if not new:
            return []
        counts = self._metadata(timeout_s)
        for topic in new:
            if not counts.get(topic):
                continue  # gone again: the claim's own row (from earliest) is all it gets
            self._claims.register_partitions(self._source, topic, range(counts[topic]), self._start_from)
            self._registered.add(topic)
            log.info(
                "topic_registered",
                source=self._source,
                topic=topic,
                partitions=counts[topic],
                start_from=self._start_from,
            )
        return [t for t in new if t in self._registered]

    def due(self, now: float) -> None:
        """Every interval: look for live topics gone from the cluster (background thread)."""
        if self._busy or now < self._due:
            return
        self._busy = True
        self._due = now + self._interval_s
        self._background.submit(self._pass, self._passed, self._failed)

    def _pass(self) -> list[str]:
        live = self._store.live_topics(self._source)
        present = self._metadata(min(10.0, self._interval_s))
        missing = {t for t in live if t not in present}
        retired = []
        for topic in sorted(missing & self._missing):
            partitions = self._store.retire_topic(self._source, topic)
            if partitions:
                retired.append(topic)
                log.warning("topic_retired", source=self._source, topic=topic, partitions=partitions)
        self._missing = missing - set(retired)
        return retired

    def _passed(self, retired: list[str]) -> None:
        self._busy = False
        self._registered -= set(retired)

    def _failed(self, exc: Exception) -> None:
        self._busy = False
        if not isinstance(exc, MetastoreError | KafkaCallFailed):
            raise exc
        log.warning("topic_watch_failed", source=self._source, error=str(exc))
