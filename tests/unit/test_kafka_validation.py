"""The position validator (KIP-320) over a stub of confluent-kafka's consumer: a validation is an
assign, paused, then a seek with the leader epoch and a resume; a seek the fetcher was not
ready for is tried again at the next poll (the partition stays paused); the first answer for
the partition after the seek decides (a record or the end of the partition: valid; librdkafka's
truncation text: truncated; another offset refusal: gone), and librdkafka's truncation texts.
The same against a broker: tests/contract/test_kafka_truncation_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from ingest.consume.kafka import Truncation
from ingest.consume.validator import ConfluentValidator, Verdict
from ingest_common.model import TopicPartition

TP = TopicPartition("t", 0)


class RawConsumer:
    """Records the calls; the first ``not_ready`` seeks fail with _STATE (fetcher not started)."""

    def __init__(self, not_ready: int = 0) -> None:
        self.not_ready = not_ready
        self.calls: list[tuple[str, Any]] = []
        self.messages: list[Any] = []

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

    def incremental_unassign(self, parts: list[Any]) -> None:
        self.calls.append(("unassign", len(parts)))

    def consume(self, n: int, timeout: float) -> list[Any]:
        out, self.messages = self.messages, []
        return out


class Message:
    def __init__(self, error: KafkaError | None = None, topic: str = "t", partition: int = 0) -> None:
        self._error, self._topic, self._partition = error, topic, partition

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


TRUNCATED = (
    "Partition log truncation detected at offset 15 (leader epoch 3): broker end offset is 9 (offset leader"
    " epoch 3). Reset to INVALID.: Local: Partition log truncation detected (broker 1)"
)


def test_a_validation_assigns_paused_then_seeks_with_the_epoch_and_resumes() -> None:
    raw = RawConsumer()
    ConfluentValidator(raw).validate(TP, 15, 3)
    assert raw.calls == [("assign", [(15, None)]), ("pause", 1), ("seek", (15, 3)), ("resume", 1)]


def test_a_seek_the_fetcher_is_not_ready_for_keeps_the_partition_paused_until_a_poll_seeks_again() -> None:
    raw = RawConsumer(not_ready=2)
    validator = ConfluentValidator(raw)
    validator.validate(TP, 15, 3)
    assert raw.calls[-1] == ("pause", 1)
    raw.messages = [Message()]  # a record fetched before the seek went through: no answer
    assert validator.poll() == []
    assert ("seek", (15, 3)) not in raw.calls and ("resume", 1) not in raw.calls
    validator.poll()
    assert raw.calls[-2:] == [("seek", (15, 3)), ("resume", 1)]


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (None, Verdict.VALID),
        (KafkaError(KafkaError._PARTITION_EOF), Verdict.VALID),
        (KafkaError(KafkaError._AUTO_OFFSET_RESET, TRUNCATED), Verdict.TRUNCATED),
        (KafkaError(KafkaError._AUTO_OFFSET_RESET, "Broker: Offset out of range"), Verdict.GONE),
    ],
)
def test_the_first_answer_after_the_seek_decides_and_the_partition_is_released(
    error: KafkaError | None, verdict: Verdict
) -> None:
    raw = RawConsumer()
    validator = ConfluentValidator(raw)
    validator.validate(TP, 15, 3)
    raw.messages = [Message(error), Message()]
    (answer,) = validator.poll()
    assert (answer.tp, answer.offset, answer.leader_epoch, answer.verdict) == (TP, 15, 3, verdict)
    if verdict is Verdict.TRUNCATED:
        assert answer.truncation == Truncation(15, 3, 9)
    assert raw.calls[-1] == ("unassign", 1)
    assert validator.poll() == []  # nothing pending any more


def test_a_forgotten_validation_gives_no_answer() -> None:
    raw = RawConsumer()
    validator = ConfluentValidator(raw)
    validator.validate(TP, 15, 3)
    validator.forget([TP])
    raw.messages = [Message()]
    assert validator.poll() == []


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
