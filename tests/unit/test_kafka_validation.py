"""ConfluentConsumer's KIP-320 validation over a stub of confluent-kafka's consumer: the seek with
the stored leader epoch that follows an assign, a seek the fetcher was not ready for (kept
paused and tried again at the next poll), and librdkafka's truncation texts."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ingest.consume.kafka import ConfluentConsumer, Truncation
from ingest_common.model import TopicPartition

TP = TopicPartition("t", 0)


class RawConsumer:
    """Records the calls; the first ``not_ready`` seeks fail with _STATE (fetcher not started)."""

    def __init__(self, not_ready: int = 0) -> None:
        self.not_ready = not_ready
        self.calls: list[tuple[str, Any]] = []

    def incremental_assign(self, parts: list[Any]) -> None:
        self.calls.append(("assign", [(p.offset, p.leader_epoch) for p in parts]))

    def seek(self, part: Any) -> None:
        if self.not_ready > 0:
            self.not_ready -= 1
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.calls.append(("seek", (part.offset, part.leader_epoch)))

    def pause(self, parts: list[Any]) -> None:
        self.calls.append(("pause", len(parts)))

    def resume(self, parts: list[Any]) -> None:
        self.calls.append(("resume", len(parts)))

    def consume(self, n: int, timeout: float) -> list[Any]:
        return []


def test_an_assign_with_a_leader_epoch_is_followed_by_a_seek_with_it() -> None:
    raw = RawConsumer()
    ConfluentConsumer(raw, incremental=True).assign({TP: 15}, {TP: 3})
    assert raw.calls == [("assign", [(15, 3)]), ("resume", 1), ("seek", (15, 3))]


def test_a_seek_the_fetcher_is_not_ready_for_keeps_the_partition_paused_until_a_poll_seeks_again() -> None:
    raw = RawConsumer(not_ready=2)
    consumer = ConfluentConsumer(raw, incremental=True)
    consumer.assign({TP: 15}, {TP: 3})
    assert raw.calls[-1] == ("pause", 1)
    consumer.set_paused([])  # the loop wants it running: it stays paused, unvalidated
    consumer.poll(10, 0.0)  # not ready yet
    assert ("resume", 1) not in raw.calls[2:] and ("seek", (15, 3)) not in raw.calls
    consumer.poll(10, 0.0)
    assert raw.calls[-2:] == [("seek", (15, 3)), ("resume", 1)]


def test_librdkafkas_truncation_texts_are_read_and_others_are_not() -> None:
    at = (
        "Partition log truncation detected at offset 15 (leader epoch 0): broker end offset is 0 (offset leader"
        " epoch 0). Reset to INVALID.: Local: Partition log truncation detected (broker 1)"
    )
    none_found = (
        "No epoch found less or equal to offset 15 (leader epoch 2): broker end offset is -1 (offset leader"
        " epoch -1). Reset using configured policy.: Local: Partition log truncation detected (broker 1)"
    )
    assert Truncation.parse(at) == Truncation(15, 0, 0)
    assert Truncation.parse(none_found) == Truncation(15, 2, -1)
    assert (
        Truncation.parse(
            "fetch failed due to requested offset not available on the broker: Broker: Offset out of range (broker 1)"
        )
        is None
    )
