"""Where each owned partition's log ends and starts, asked of the brokers without reading a
record: the worker's other boundary to Kafka (its group member is ingest.consume.kafka).

A query asks, for every partition at once, the **last stable offset** (ListOffsets latest
under ``read_committed``: below it every transaction is decided, so a reader that reads to it
never waits for one) with the leader's epoch, and the **earliest** offset still in the log;
then, once those are answered, each topic's **id** (KIP-516). Splits are cut from them
(ingest.consume.cutter); the earliest offset moving past where a partition is read is an
offset gap, and a topic id other than the one stored with the partition's offset a re-created
topic (ingest.consume.gaps), both found before Spark is asked to read what is gone or another
log's records.

The ids are asked *after* the offsets: topic ids are never reused, so an id that is still the
stored one once the offsets were answered was the topic's when they were, and the offsets are
that topic's log's. (Asked before, a topic re-created in between would pass its offsets off as
the old one's.)

:meth:`LogOffsets.query` never blocks: the answers arrive on librdkafka's background thread
and the polling thread picks them up at a later step. :meth:`LogOffsets.watermarks` blocks,
bounded: for the rebalance callback (pinning a first start offset) and the background thread
(measuring a gap).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from confluent_kafka import IsolationLevel, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.config import kafka_error
from ingest.consume.kafka import KafkaCallFailed, kafka_error_text
from ingest.topics import kafka_topic_id
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)


# The error of a partition whose topic the broker does not know (deleted, or not created yet).
UNKNOWN_TOPIC = "unknown topic or partition"


@dataclass(frozen=True, slots=True)
class LogEnd:
    """One partition's log as a query found it."""

    # The last stable offset: a read_committed reader reads every offset below it without waiting.
    stable: int
    # The partition leader's epoch the answer was given under (None: the broker gave none).
    leader_epoch: int | None
    # The first offset still in the log (retention, delete_records moved it).
    earliest: int
    # Kafka's id of the topic (KIP-516), asked after the offsets were answered (None: the
    # cluster gives topics no id, or the answer does not tell it: nothing to compare).
    topic_id: str | None = None


class OffsetsQuery(Protocol):
    def done(self) -> bool: ...

    def wait(self, timeout_s: float) -> bool:
        """Wait until done, at most ``timeout_s``; whether it is done."""
        ...

    def result(self) -> tuple[dict[TopicPartition, LogEnd], dict[TopicPartition, str]]:
        """Once done: the answer for each partition, and the error of each that got none."""
        ...


class Watermarks(Protocol):
    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        """(earliest, last stable offset) asked of the broker. Raises KafkaCallFailed."""
        ...

    def topic_ids(self, topics: Sequence[str], timeout_s: float) -> dict[str, str | None]:
        """Kafka's id of each topic it knows (KIP-516; None: a cluster that gives topics no
        id); a topic it does not know is left out. Raises KafkaCallFailed (no answer)."""
        ...


class LogOffsets(Watermarks, Protocol):
    def query(self, tps: Sequence[TopicPartition]) -> OffsetsQuery:
        """Ask for every partition's :class:`LogEnd`; never blocks."""
        ...

    def close(self) -> None: ...


# Asks the ids of some topics (confluent-kafka's describe_topics): a future per topic.
Describe = Callable[[list[str]], dict[str, Future[Any]]]


def _error_text(exc: KafkaException) -> str:
    """UNKNOWN_TOPIC for a topic the broker does not know, else the error's text."""
    error = kafka_error(exc)
    unknown = error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    return UNKNOWN_TOPIC if unknown else kafka_error_text(exc)


class _AdminQuery:
    def __init__(
        self,
        latest: dict[Any, Future[Any]],
        earliest: dict[Any, Future[Any]],
        on_errors: Callable[[set[str]], None] = lambda _topics: None,
        describe: Describe | None = None,
    ) -> None:
        self._latest = latest
        self._earliest = earliest
        self._on_errors = on_errors
        # The topics' ids, asked once the offsets are answered (None: not asked for, or not yet).
        self._describe = describe
        self._ids: dict[str, Future[Any]] | None = None

    def _offsets(self) -> list[Future[Any]]:
        return [*self._latest.values(), *self._earliest.values()]

    def _ids_asked(self) -> list[Future[Any]]:
        """Once every offset is answered: the ids' futures (asked now, the first time)."""
        if self._describe is None or not all(f.done() for f in self._offsets()):
            return []
        if self._ids is None:
            topics = sorted({k.topic for k in self._latest})
            try:
                self._ids = self._describe(topics) if topics else {}
            except KafkaException as exc:
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                self._ids = dict.fromkeys(topics, failed)
        return list(self._ids.values())

    def done(self) -> bool:
        if not all(f.done() for f in self._offsets()):
            return False
        return all(f.done() for f in self._ids_asked())

    def wait(self, timeout_s: float) -> bool:
        """Wait until done, at most ``timeout_s``; whether it is done."""
        deadline = time.monotonic() + timeout_s
        futures_wait(self._offsets(), timeout=timeout_s)
        futures_wait(self._ids_asked(), timeout=max(0.0, deadline - time.monotonic()))
        return self.done()

    def result(self) -> tuple[dict[TopicPartition, LogEnd], dict[TopicPartition, str]]:
        ends: dict[TopicPartition, LogEnd] = {}
        errors: dict[TopicPartition, str] = {}
        earliest = {(k.topic, k.partition): f for k, f in self._earliest.items()}
        ids: dict[str, str | None] = {}
        id_errors: dict[str, str] = {}
        for topic, future in (self._ids or {}).items():
            if not future.done():
                id_errors[topic] = "the topic's id: no answer yet"
                continue
            try:
                ids[topic] = kafka_topic_id(future.result(timeout=0))
            except KafkaException as exc:
                id_errors[topic] = _error_text(exc)
        for ktp, future in self._latest.items():
            tp = TopicPartition(ktp.topic, ktp.partition)
            try:
                latest = future.result(timeout=0)
                first = earliest[(ktp.topic, ktp.partition)].result(timeout=0)
            except KafkaException as exc:
                errors[tp] = _error_text(exc)
                continue
            if self._describe is not None and tp.topic not in ids:
                # Offsets whose topic's id is not known are not taken: they may be another log's.
                errors[tp] = id_errors.get(tp.topic, "no topic id in the answer")
                continue
            epoch = latest.leader_epoch
            ends[tp] = LogEnd(
                int(latest.offset),
                None if epoch is None or epoch < 0 else int(epoch),
                int(first.offset),
                ids.get(tp.topic),
            )
        if errors:
            self._on_errors({tp.topic for tp in errors})
        return ends, errors


class AdminLogOffsets:
    """:class:`LogOffsets` over confluent-kafka's ``AdminClient`` (``config.kafka_client``):
    ListOffsets requests, one per partition leader, for every partition of a query.

    The admin client finds a partition's leader in its metadata cache, which does not learn of
    partitions added to a topic (nor of leaders moved) by itself: a partition it has no leader
    for fails ("No leaders found"). A failed answer has the topics' metadata asked again, off
    the caller's thread (at most one refresh under way, one every ``REFRESH_S``); a blocking
    :meth:`watermarks` refreshes and asks once more itself."""

    REFRESH_S = 1.0

    def __init__(self, admin: Any, request_timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._timeout_s = request_timeout_s
        self._refresh_lock = threading.Lock()
        self._refreshing = False
        self._refreshed_at = 0.0

    def query(self, tps: Sequence[TopicPartition]) -> OffsetsQuery:
        return self._query(tps, self._stale, self._describe)

    def _describe(self, topics: list[str]) -> dict[str, Future[Any]]:
        from confluent_kafka import TopicCollection

        futures: dict[str, Future[Any]] = self._admin.describe_topics(
            TopicCollection(topics), request_timeout=self._timeout_s
        )
        return futures

    def topic_ids(self, topics: Sequence[str], timeout_s: float) -> dict[str, str | None]:
        asked = sorted(set(topics))
        if not asked:
            return {}
        try:
            futures = self._describe(asked)
        except KafkaException as exc:
            raise KafkaCallFailed(f"ids of topics {', '.join(asked)}: {kafka_error_text(exc)}") from exc
        futures_wait(list(futures.values()), timeout=timeout_s)
        ids: dict[str, str | None] = {}
        for topic, future in futures.items():
            if not future.done():
                raise KafkaCallFailed(f"id of topic {topic}: no answer within {timeout_s:g} s")
            try:
                ids[topic] = kafka_topic_id(future.result(timeout=0))
            except KafkaException as exc:
                if _error_text(exc) != UNKNOWN_TOPIC:
                    raise KafkaCallFailed(f"id of topic {topic}: {kafka_error_text(exc)}") from exc
        return ids

    def _stale(self, topics: set[str]) -> None:
        """Refresh the topics' metadata in the background (throttled)."""
        with self._refresh_lock:
            if self._refreshing or time.monotonic() - self._refreshed_at < self.REFRESH_S:
                return
            self._refreshing = True
        threading.Thread(target=self._refresh, args=(sorted(topics),), name="ingest-metadata", daemon=True).start()

    def _refresh(self, topics: list[str], timeout_s: float = 5.0) -> None:
        try:
            for topic in topics:
                self._admin.list_topics(topic=topic, timeout=timeout_s)
        except KafkaException as exc:
            log.info("metadata_refresh_failed", topics=topics, error=kafka_error_text(exc))
        finally:
            with self._refresh_lock:
                self._refreshing = False
                self._refreshed_at = time.monotonic()

    def _query(
        self, tps: Sequence[TopicPartition], on_errors: Callable[[set[str]], None], describe: Describe | None = None
    ) -> _AdminQuery:
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        ktps = [KafkaTopicPartition(tp.topic, tp.partition) for tp in tps]
        if not ktps:
            return _AdminQuery({}, {}, on_errors)
        # confluent-kafka's OffsetSpec has no type hints.
        latest_spec: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        earliest_spec: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = self._admin.list_offsets(
            dict.fromkeys(ktps, latest_spec),
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self._timeout_s,
        )
        earliest = self._admin.list_offsets(dict.fromkeys(ktps, earliest_spec), request_timeout=self._timeout_s)
        return _AdminQuery(latest, earliest, on_errors, describe)

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_s
        for attempt in range(2):
            query = self._query([tp], lambda _topics: None)
            if not query.wait(max(0.0, deadline - time.monotonic())):
                raise KafkaCallFailed(f"watermarks of {tp}: no answer within {timeout_s:g} s")
            ends, errors = query.result()
            if tp in ends:
                return ends[tp].earliest, ends[tp].stable
            if attempt == 0:
                self._refresh([tp.topic], max(0.1, min(5.0, deadline - time.monotonic())))
        raise KafkaCallFailed(f"watermarks of {tp}: {errors.get(tp, 'no answer')}")

    def close(self) -> None:
        """The admin client has nothing to flush; its handle goes with the object."""
