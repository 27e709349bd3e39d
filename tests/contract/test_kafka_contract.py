"""One contract for the worker's Kafka boundaries, run against the in-memory fakes the unit
tests use (tests.memory_kafka) and confluent-kafka on a real Apache Kafka broker
(tests/contract/conftest.py): what the unit tests assume is what the real clients do. Here:
the group member reads nothing (its partitions are paused from their assignment), where a
partition's log ends (the last stable offset under open, committed and aborted transactions,
the earliest offset after records were deleted), and the validation of a position (valid in
the log and at its end, gone below its start). The group (callbacks, commits) is
test_kafka_group_contract.py; a truncated log, test_kafka_truncation_contract.py."""

from __future__ import annotations

import pytest

from ingest.consume.kafka import Batch
from ingest.consume.log_offsets import LogEnd
from ingest.consume.validator import PositionValidator, Validation, Verdict
from ingest_common.model import TopicPartition
from ingest_dev.testkit import wait_until
from tests.contract.conftest import Backend


def log_end(backend: Backend, tp: TopicPartition) -> LogEnd:
    query = backend.offsets.query([tp])
    assert query.wait(10.0)
    ends, errors = query.result()
    assert errors == {}, errors
    return ends[tp]


def answer(validator: PositionValidator, timeout_s: float = 20.0) -> Validation:
    answers: list[Validation] = []
    wait_until(lambda: answers.extend(validator.poll()) or answers, timeout_s, "the validation's answer", interval=0.05)
    (only,) = answers
    return only


@pytest.mark.parametrize("incremental", [True, False], ids=["cooperative", "eager"])
def test_an_assigned_partition_delivers_nothing(backend: Backend, incremental: bool) -> None:
    consumer = backend.make_consumer(incremental)
    backend.produce_to(backend.tp, 20)
    consumer.assign({backend.tp: 0, backend.other: 0})
    batches: list[Batch] = []
    for _ in range(10):
        batches.append(consumer.poll(0.1))
    assert sum(b.records_dropped for b in batches) == 0
    assert not any(b.refused or b.truncated or b.errors for b in batches)


def test_the_log_end_is_the_last_stable_offset_and_the_earliest_offset_still_in_the_log(backend: Backend) -> None:
    backend.produce(20)
    end = log_end(backend, backend.tp)
    assert (end.stable, end.earliest) == (20, 0) and end.leader_epoch is not None
    assert backend.offsets.watermarks(backend.tp, 10.0) == (0, 20)
    backend.delete_before(8)
    assert log_end(backend, backend.tp).earliest == 8
    other = log_end(backend, backend.other)
    assert (other.stable, other.earliest) == (0, 0)


def test_the_log_end_names_the_topics_id_and_a_topic_the_broker_does_not_know_has_none(backend: Backend) -> None:
    """KIP-516: every topic has an id of its own (a topic re-created under its name another);
    the log-end answer carries it, as the ids asked on their own give it."""
    backend.produce(3)  # a partition the broker has written to is led (a new one may not be yet)
    backend.produce_to(backend.other, 1)
    ids = backend.offsets.topic_ids([backend.tp.topic, "no-such-topic-here"], 10.0)
    assert list(ids) == [backend.tp.topic]
    topic_id = ids[backend.tp.topic]
    assert topic_id is not None and len(topic_id) == 22  # as Kafka prints it: base64, no padding
    assert log_end(backend, backend.tp).topic_id == topic_id == log_end(backend, backend.other).topic_id


def test_the_last_stable_offset_stops_at_an_open_transaction_and_passes_its_marker_once_decided(
    backend: Backend,
) -> None:
    backend.produce(5)
    backend.begin_transaction(3)  # offsets 5, 6, 7: open
    backend.produce_to(backend.other, 1)
    assert log_end(backend, backend.tp).stable == 5
    backend.end_transaction(False)  # aborted: its marker at 8
    wait_until(lambda: log_end(backend, backend.tp).stable == 9, 20, "the stable offset past the marker")


def test_a_position_in_the_log_or_at_its_end_is_valid_and_one_below_its_start_is_gone(backend: Backend) -> None:
    backend.produce(20)
    epoch = log_end(backend, backend.tp).leader_epoch
    assert epoch is not None
    validator = backend.make_validator()
    validator.validate(backend.tp, 15, epoch)
    assert answer(validator).verdict is Verdict.VALID
    validator.validate(backend.tp, 20, epoch)
    assert answer(validator).verdict is Verdict.VALID
    backend.delete_before(10)
    validator.validate(backend.tp, 5, epoch)
    gone = answer(validator)
    assert (gone.tp, gone.offset, gone.verdict) == (backend.tp, 5, Verdict.GONE)
    validator.validate(backend.other, 0, epoch)  # an empty partition: its end
    assert answer(validator).verdict is Verdict.VALID
