"""Where each owned partition's log ends and starts, asked of the brokers without reading a
record: the worker's other boundary to Kafka (its group member is ingest.consume.kafka).

A query asks, for every partition at once, the **last stable offset** (ListOffsets latest
under ``read_committed``: below it every transaction is decided, so a reader that reads to it
never waits for one) with the leader's epoch, and the **earliest** offset still in the log.
Splits are cut from them (ingest.consume.cutter); the earliest offset moving past where a
partition is read is an offset gap (ingest.consume.gaps), found before Spark is asked to
read what is gone.

:meth:`LogOffsets.query` never blocks: the answers arrive on librdkafka's background thread
and the polling thread picks them up at a later step. :meth:`LogOffsets.watermarks` blocks,
bounded: for the rebalance callback (pinning a first start offset) and the background thread
(measuring a gap).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.consume.kafka import KafkaCallFailed, kafka_error_text
from ingest_common.model import TopicPartition


@dataclass(frozen=True, slots=True)
class LogEnd:
    """One partition's log as a query found it."""

    # The last stable offset: a read_committed reader reads every offset below it without waiting.
    stable: int
    # The partition leader's epoch the answer was given under (None: the broker gave none).
    leader_epoch: int | None
    # The first offset still in the log (retention, delete_records moved it).
    earliest: int


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


class LogOffsets(Watermarks, Protocol):
    def query(self, tps: Sequence[TopicPartition]) -> OffsetsQuery:
        """Ask for every partition's :class:`LogEnd`; never blocks."""
        ...

    def close(self) -> None: ...


class _AdminQuery:
    def __init__(self, latest: dict[Any, Future[Any]], earliest: dict[Any, Future[Any]]) -> None:
        self._latest = latest
        self._earliest = earliest

    def done(self) -> bool:
        return all(f.done() for f in self._latest.values()) and all(f.done() for f in self._earliest.values())

    def wait(self, timeout_s: float) -> bool:
        """Wait until done, at most ``timeout_s``; whether it is done."""
        futures_wait([*self._latest.values(), *self._earliest.values()], timeout=timeout_s)
        return self.done()

    def result(self) -> tuple[dict[TopicPartition, LogEnd], dict[TopicPartition, str]]:
        ends: dict[TopicPartition, LogEnd] = {}
        errors: dict[TopicPartition, str] = {}
        earliest = {(k.topic, k.partition): f for k, f in self._earliest.items()}
        for ktp, future in self._latest.items():
            tp = TopicPartition(ktp.topic, ktp.partition)
            try:
                latest = future.result(timeout=0)
                first = earliest[(ktp.topic, ktp.partition)].result(timeout=0)
            except KafkaException as exc:
                errors[tp] = kafka_error_text(exc)
                continue
            epoch = latest.leader_epoch
            ends[tp] = LogEnd(int(latest.offset), None if epoch is None or epoch < 0 else int(epoch), int(first.offset))
        return ends, errors


class AdminLogOffsets:
    """:class:`LogOffsets` over confluent-kafka's ``AdminClient`` (``config.kafka_client``):
    ListOffsets requests, one per partition leader, for every partition of a query."""

    def __init__(self, admin: Any, request_timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._timeout_s = request_timeout_s

    def query(self, tps: Sequence[TopicPartition]) -> OffsetsQuery:
        return self._query(tps)

    def _query(self, tps: Sequence[TopicPartition]) -> _AdminQuery:
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        ktps = [KafkaTopicPartition(tp.topic, tp.partition) for tp in tps]
        if not ktps:
            return _AdminQuery({}, {})
        # confluent-kafka's OffsetSpec has no type hints.
        latest_spec: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        earliest_spec: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = self._admin.list_offsets(
            dict.fromkeys(ktps, latest_spec),
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self._timeout_s,
        )
        earliest = self._admin.list_offsets(dict.fromkeys(ktps, earliest_spec), request_timeout=self._timeout_s)
        return _AdminQuery(latest, earliest)

    def watermarks(self, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
        query = self._query([tp])
        if not query.wait(timeout_s):
            raise KafkaCallFailed(f"watermarks of {tp}: no answer within {timeout_s:g} s")
        ends, errors = query.result()
        if tp not in ends:
            raise KafkaCallFailed(f"watermarks of {tp}: {errors.get(tp, 'no answer')}")
        return ends[tp].earliest, ends[tp].stable

    def close(self) -> None:
        """The admin client has nothing to flush; its handle goes with the object."""
