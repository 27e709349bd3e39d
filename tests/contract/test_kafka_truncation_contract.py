"""KIP-320 as the worker's position validator sees it (ingest.consume.validator), against the
in-memory validator the unit tests use (tests.memory_kafka) and confluent-kafka on a real
Apache Kafka broker whose partition log was lost (ingest_dev.kafka.LocalKafka.lose_partition_log)
and then grew past the position again: validated under the leader epoch stored with the
position, the truncation is the answer (librdkafka: _AUTO_OFFSET_RESET under
auto.offset.reset=error, with its _LOG_TRUNCATION text), with where the broker's log of that
epoch ends; under the new leader's epoch the same position is valid, which is why a position is
always validated under the epoch it was known under, never a newer one."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer

from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import Truncation
from ingest.consume.validator import ConfluentValidator, PositionValidator, Validation, Verdict
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.memory_kafka import MemoryBroker, MemoryValidator

STORED = 15  # published up to here, from records of the first leader epoch
BEFORE, AFTER = 20, 30  # records before the log was lost, and produced after


@dataclass
class Truncated:
    """A partition whose log was lost after ``BEFORE`` records and holds ``AFTER`` others now."""

    tp: TopicPartition
    epoch_before: int
    epoch_after: int
    make_validator: Callable[[], PositionValidator]


def _memory() -> Truncated:
    broker, tp = MemoryBroker(), TopicPartition("t", 0)
    broker.produce(tp, *(b"%d" % i for i in range(BEFORE)))
    broker.truncate(tp, 0)
    broker.produce(tp, *(b"%d" % i for i in range(AFTER)))

    return Truncated(tp, 0, broker.epochs[tp], lambda: MemoryValidator(broker))


@dataclass(frozen=True)
class TruncatedLog:
    """The truncated partition on a broker of this module's own."""

    bootstrap: str
    tp: TopicPartition
    epoch_before: int
    epoch_after: int


@pytest.fixture(scope="module")
def truncated_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TruncatedLog]:
    """One broker and one truncated partition for every test of the module (a broker of its own
    and the log's loss cost ~20 s): the tests only read the partition, each in a consumer group
    of its own that commits nothing (enable.auto.commit=false), so none sees another's traces.
    Started like ``private_kafka`` (tests/fixtures/servers.py), which is per test."""
    from ingest_dev.kafka import LocalKafka
    from ingest_dev.kafka_clients import create_topic, produce_records, record_leader_epochs

    broker = LocalKafka(base_dir=tmp_path_factory.mktemp("truncation") / "kafka")
    broker.start()
    try:
        bootstrap, topic = broker.bootstrap, f"trunc-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 1)
        produce_records(bootstrap, topic, ((0, b"k", b"%d" % i) for i in range(BEFORE)))
        [before] = record_leader_epochs(bootstrap, topic, 0)
        broker.lose_partition_log(topic, 0)
        produce_records(bootstrap, topic, ((0, b"k", b"%d" % i) for i in range(AFTER)))
        [after] = record_leader_epochs(bootstrap, topic, 0)
        yield TruncatedLog(bootstrap, TopicPartition(topic, 0), before, after)
    finally:
        broker.stop()


def _kafka(log: TruncatedLog) -> Iterator[Truncated]:
    validators: list[PositionValidator] = []

    def make() -> PositionValidator:
        conf: dict[str, Any] = {
            **PROTOCOL_PROPERTIES,
            "bootstrap.servers": log.bootstrap,
            "group.id": f"contract-{uuid.uuid4().hex[:8]}",
            "max.partition.fetch.bytes": 1,
            "fetch.wait.max.ms": 100,
        }
        validator = ConfluentValidator(KafkaConsumer(conf))
        validators.append(validator)
        return validator

    yield Truncated(log.tp, log.epoch_before, log.epoch_after, make)
    for validator in validators:
        validator.close()


@pytest.fixture(params=["memory", "kafka"])
def truncated(request: pytest.FixtureRequest) -> Iterator[Truncated]:
    if request.param == "memory":
        yield _memory()
    else:
        yield from _kafka(request.getfixturevalue("truncated_log"))


def _answer(validator: PositionValidator) -> Validation:
    answers: list[Validation] = []
    wait_until(lambda: answers.extend(validator.poll()) or answers, 90, "the validation's answer", interval=0.05)
    (only,) = answers
    return only


def test_a_position_validated_under_its_old_leader_epoch_is_found_truncated(truncated: Truncated) -> None:
    assert truncated.epoch_after > truncated.epoch_before  # the lost log came back under a new leader
    validator = truncated.make_validator()
    validator.validate(truncated.tp, STORED, truncated.epoch_before)
    answer = _answer(validator)
    assert (answer.tp, answer.verdict) == (truncated.tp, Verdict.TRUNCATED)
    # The whole log of the first epoch is gone: the broker's log of it ends at 0.
    assert answer.truncation == Truncation(STORED, truncated.epoch_before, 0)
    assert Truncation.parse(answer.text) == answer.truncation


def test_the_same_position_under_the_new_leader_epoch_is_valid(truncated: Truncated) -> None:
    """Why the cutter validates under the epoch the position was known under: asked under the
    new leader's epoch, the broker confirms a position whose records are not the ones published."""
    validator = truncated.make_validator()
    validator.validate(truncated.tp, STORED, truncated.epoch_after)
    assert _answer(validator).verdict is Verdict.VALID
