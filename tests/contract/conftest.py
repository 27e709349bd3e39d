"""The two Kafka backends the contracts run against: the in-memory group member, log-end
queries and validator the unit tests use (tests.memory_kafka) and confluent-kafka on a real
Apache Kafka broker (ingest.consume.kafka, log_offsets, validator). Each has a topic of two
partitions, ``tp`` and ``other``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from ingest.config import PROTOCOL_PROPERTIES
from ingest.consume.kafka import ConfluentConsumer, Consumer
from ingest.consume.log_offsets import AdminLogOffsets, LogOffsets
from ingest.consume.validator import ConfluentValidator, PositionValidator
from ingest_common.model import TopicPartition
from tests.memory_kafka import MemoryBroker, MemoryConsumer, MemoryLogOffsets, MemoryValidator

# The shortest the broker allows (it must be at least the session timeout, 6 s).
MAX_POLL_INTERVAL_S = 6.0

# What a second member joining the group gives the test: the step to call while waiting for
# the rebalance (a real member must poll to take part), and what the new member holds.
Joining = tuple[Callable[[], None], Callable[[], set[TopicPartition]]]


@dataclass
class Backend:
    name: str
    tp: TopicPartition
    other: TopicPartition
    # A consumer of the backend's group, cooperative (incremental) or eager; closed at teardown.
    make_consumer: Callable[[bool], Consumer]
    produce_to: Callable[[TopicPartition, int], object]
    delete_before: Callable[[int], None]
    # The group offsets committed so far, as another member would read them.
    committed: Callable[[], dict[TopicPartition, int]]
    # A second member joins the group ``first`` (cooperative or eager) is in.
    second_member: Callable[[Consumer, bool], Joining]
    # The member does not poll for longer than max.poll.interval.ms: the group drops it.
    stall: Callable[[Consumer], None]
    # Where the topic's logs end (ListOffsets), and a position validator (KIP-320).
    offsets: LogOffsets
    make_validator: Callable[[], PositionValidator]
    # Records of ``tp`` in a transaction left open, then its end (committed or aborted).
    begin_transaction: Callable[[int], None]
    end_transaction: Callable[[bool], None]
    consumers: list[Consumer] = field(default_factory=list)

    def produce(self, n: int) -> None:
        self.produce_to(self.tp, n)

    @property
    def consumer(self) -> Consumer:
        """The first consumer made (cooperative), made on first use."""
        if not self.consumers:
            self.make_consumer(True)
        return self.consumers[0]


def _values(n: int) -> list[bytes]:
    return [str(i).encode() for i in range(n)]


def _memory() -> Iterator[Backend]:
    broker = MemoryBroker()
    tp, other = TopicPartition("t", 0), TopicPartition("t", 1)
    broker.topic_ids["t"] = "M2VtbW9yeVRvcGljSWQxMQ"
    broker.produce(tp)
    broker.produce(other)
    backend: Backend

    def make(incremental: bool) -> Consumer:
        consumer = MemoryConsumer(broker, incremental=incremental)
        backend.consumers.append(consumer)
        return consumer

    def committed() -> dict[TopicPartition, int]:
        folded: dict[TopicPartition, int] = {}
        for consumer in backend.consumers:
            assert isinstance(consumer, MemoryConsumer)
            for commit in consumer.commits:
                folded.update(commit)
        return folded

    def second_member(
        first: Consumer, incremental: bool
    ) -> tuple[Callable[[], None], Callable[[], set[TopicPartition]]]:
        assert isinstance(first, MemoryConsumer)
        first.group_rebalances(keep=[tp])  # the group gives ``other`` to the new member
        return (lambda: None), (lambda: {other})

    def stall(consumer: Consumer) -> None:
        assert isinstance(consumer, MemoryConsumer)
        consumer.group_loses(*sorted(consumer.positions))
        consumer.group_assigns(tp, other)  # it rejoins, alone

    backend = Backend(
        "memory",
        tp,
        other,
        make,
        lambda t, n: broker.produce(t, *_values(n)),
        lambda o: broker.delete_before(tp, o),
        committed,
        second_member,
        stall,
        MemoryLogOffsets(broker),
        lambda: MemoryValidator(broker),
        lambda n: broker.begin_transaction(tp, *_values(n)),
        lambda commit: broker.end_transaction(tp, commit=commit),
    )
    yield backend


def _kafka(request: pytest.FixtureRequest) -> Iterator[Backend]:
    from confluent_kafka import Producer

    from ingest_dev.kafka_clients import produce_records

    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    topic = request.getfixturevalue("make_topic")(partitions=2)
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    group = f"contract-{uuid.uuid4().hex[:8]}"
    members: list[Any] = []  # second members' plain clients
    validators: list[PositionValidator] = []
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"contract-{uuid.uuid4().hex[:8]}"})
    backend: Backend

    def conf(incremental: bool) -> dict[str, Any]:
        return {
            **PROTOCOL_PROPERTIES,
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "max.poll.interval.ms": int(MAX_POLL_INTERVAL_S * 1000),
            "partition.assignment.strategy": "cooperative-sticky" if incremental else "range",
        }

    def make(incremental: bool) -> Consumer:
        consumer = ConfluentConsumer(KafkaConsumer(conf(incremental)), incremental=incremental)
        backend.consumers.append(consumer)
        return consumer

    def make_validator() -> PositionValidator:
        validator = ConfluentValidator(
            KafkaConsumer(
                {
                    **PROTOCOL_PROPERTIES,
                    "bootstrap.servers": bootstrap,
                    "group.id": f"{group}-validator",
                    "max.partition.fetch.bytes": 1,
                    "fetch.wait.max.ms": 100,
                }
            )
        )
        validators.append(validator)
        return validator

    def begin_transaction(n: int) -> None:
        transactional.init_transactions(30)
        transactional.begin_transaction()
        for value in _values(n):
            transactional.produce(topic, value, partition=0)
        transactional.flush(30)

    def end_transaction(commit: bool) -> None:
        (transactional.commit_transaction if commit else transactional.abort_transaction)(30)

    def delete_before(offset: int) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.delete_records([KafkaTopicPartition(topic, 0, offset)], request_timeout=30)
        for future in futures.values():
            future.result(timeout=30)

    def committed() -> dict[TopicPartition, int]:
        reader = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            found = reader.committed([KafkaTopicPartition(topic, 0), KafkaTopicPartition(topic, 1)], timeout=10)
        finally:
            reader.close()
        return {TopicPartition(p.topic, p.partition): p.offset for p in found if p.offset >= 0}

    def second_member(
        first: Consumer, incremental: bool
    ) -> tuple[Callable[[], None], Callable[[], set[TopicPartition]]]:
        held: set[TopicPartition] = set()
        client = KafkaConsumer(conf(incremental))
        members.append(client)

        def on_assign(c: Any, partitions: list[KafkaTopicPartition]) -> None:
            held.update(TopicPartition(p.topic, p.partition) for p in partitions)
            (c.incremental_assign if incremental else c.assign)(partitions)

        def on_revoke(c: Any, partitions: list[KafkaTopicPartition]) -> None:
            held.difference_update(TopicPartition(p.topic, p.partition) for p in partitions)
            if incremental:
                c.incremental_unassign(partitions)
            else:
                c.unassign()

        client.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return (lambda: client.consume(100, 0.1) and None), (lambda: set(held))

    backend = Backend(
        "kafka",
        tp,
        other,
        make,
        lambda t, n: produce_records(bootstrap, topic, ((t.partition, None, v) for v in _values(n))),
        delete_before,
        committed,
        second_member,
        lambda _consumer: time.sleep(MAX_POLL_INTERVAL_S + 2),  # the fault: no poll, on purpose
        AdminLogOffsets(AdminClient({"bootstrap.servers": bootstrap})),
        make_validator,
        begin_transaction,
        end_transaction,
    )
    yield backend
    for consumer in backend.consumers:
        consumer.close()
    for client in members:
        client.close()
    for validator in validators:
        validator.close()


@pytest.fixture(params=["memory", "kafka"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from (_memory() if request.param == "memory" else _kafka(request))
