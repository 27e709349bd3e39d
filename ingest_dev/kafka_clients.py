"""Small, time-bounded Kafka admin and producer helpers that work against any cluster (the
local broker, a container, a real one): create and delete topics, read end offsets, produce
records and learn where each partition's log ends (and under which leader epochs it was written)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ingest_dev.kafka import PROBE_LOG
from ingest_dev.testkit import wait_until


def create_topic(
    bootstrap: str, name: str, partitions: int, timeout: float = 30, config: Mapping[str, Any] | None = None
) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1) and wait until usable.

    Returns once the broker's metadata lists every partition with a leader.  An existing
    topic with the same partition count is accepted (idempotent); a different count raises.
    ``config`` adds admin client settings (a secured listener's, say).
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise

    def usable() -> bool:
        # All-topics metadata: asking for one topic by name could auto-create it.
        metadata = admin.list_topics(timeout=max(0.1, min(deadline - time.monotonic(), 5.0)))
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            return False
        if len(topic.partitions) not in (0, partitions):
            raise ValueError(f"topic {name!r} exists with {len(topic.partitions)} partitions, wanted {partitions}")
        return len(topic.partitions) == partitions and all(
            p.leader >= 0 and p.error is None for p in topic.partitions.values()
        )

    wait_until(
        usable,
        max(0.0, deadline - time.monotonic()),
        f"every partition of topic {name!r} to have a leader",
        interval=0.05,
    )


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 10) -> None:
    """Delete topics (best effort for cleanup: raises on the first failure after trying all)."""
    from confluent_kafka.admin import AdminClient

    names = list(names)
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    errors: list[str] = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout)
        except Exception as exc:
            errors.append(f"{topic}: {exc}")
    if errors:
        raise RuntimeError("delete_topics failed: " + "; ".join(errors))


def end_offsets(
    bootstrap: str, topic: str, timeout: float = 10.0, config: Mapping[str, Any] | None = None
) -> dict[int, int]:
    """Every partition's log end offset (high watermark) as the broker reports it now; ``config``
    adds consumer settings (a secured listener's, say)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ingest-end-offsets",
            "enable.auto.commit": False,
            **(config or {}),
        },
        logger=PROBE_LOG,
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        return {
            p: int(consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=timeout)[1])
            for p in partitions
        }
    finally:
        consumer.close()


def record_leader_epochs(bootstrap: str, topic: str, partition: int, timeout: float = 60.0) -> set[int]:
    """The leader epochs a partition's records were written under, read from its start to its end."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ingest-leader-epochs", "enable.partition.eof": True},
        logger=PROBE_LOG,
    )
    reader.assign([KafkaTopicPartition(topic, partition, 0)])
    seen: set[int] = set()

    def at_end() -> bool:
        msg = reader.poll(0.5)
        if msg is None:
            return False
        if msg.error() is not None:
            return True  # the end of the partition (or an error: what was read is the answer)
        epoch = msg.leader_epoch()
        if epoch is not None:
            seen.add(int(epoch))
        return False

    try:
        wait_until(at_end, timeout, f"{topic}[{partition}] read to its end")
    finally:
        reader.close()
    return seen


def produce_records(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[int | None, bytes | None, bytes | None]],
    timeout: float = 60,
    config: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Produce ``(partition, key, value)`` records and return each partition's log end offset.

    ``partition=None`` lets the partitioner choose from the key (``murmur2_random``, the
    Java client's scheme).  The log end of a partition is its highest delivered offset + 1,
    taken from the delivery reports: the ground truth of what this call wrote (with a
    transactional or idempotent producer the broker's high watermark may lie beyond it,
    past control records).  Raises on any
    delivery error, or ``TimeoutError`` if not everything is delivered within ``timeout``.
    ``config`` overrides producer settings (e.g. ``{"batch.num.messages": 1}``).
    """
    from confluent_kafka import KafkaError, Message, Producer

    deadline = time.monotonic() + timeout
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": f"produce-records-{uuid.uuid4().hex[:8]}",
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "batch.size": 4 * 1024 * 1024,
        "queue.buffering.max.messages": 500000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "partitioner": "murmur2_random",
        # Every record must be delivered (or fail) before our own deadline.
        "message.timeout.ms": max(1000, int(timeout * 1000)),
    }
    if config:
        conf.update(config)
    producer = Producer(conf)
    log_end: dict[int, int] = {}
    failures: list[str] = []
    produced = 0
    delivered = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered
        delivered += 1
        if err is not None:
            failures.append(f"partition {msg.partition()}: {err}")
            return
        partition = msg.partition()
        offset = msg.offset()
        # A delivered message always carries both; the stubs say Optional.
        assert partition is not None and offset is not None
        if offset + 1 > log_end.get(partition, 0):
            log_end[partition] = offset + 1

    for partition, key, value in records:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"produce_records: local queue still full after {timeout:.1f} s")
            try:
                if partition is None:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                else:
                    producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                # Local queue full: serve delivery reports to make room.
                producer.poll(0.05)
        produced += 1
        if failures:
            break
        if produced % 10000 == 0:
            producer.poll(0)
    remaining_msgs = producer.flush(max(0.0, deadline - time.monotonic()))
    if failures:
        raise RuntimeError(f"produce_records to {topic!r}: {len(failures)} delivery error(s), first: {failures[0]}")
    if remaining_msgs > 0 or delivered != produced:
        raise TimeoutError(
            f"produce_records to {topic!r}: {produced - delivered} of {produced} records undelivered"
            f" after {timeout:.1f} s"
        )
    return log_end


def read_records(
    bootstrap: str, topic: str, ends: Mapping[int, int], timeout: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every committed record of ``topic`` below ``ends`` (per partition), read back as
    ``(partition, offset, key, value)`` in offset order per partition: the log as Kafka holds it
    (read_committed). Bounded by ``timeout`` (TimeoutError)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ingest-read-records-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        },
        logger=PROBE_LOG,
    )
    records: list[tuple[int, int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([KafkaTopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        position = dict.fromkeys((p for p, end in ends.items() if end > 0), 0)
        while any(position[p] < ends[p] for p in position):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(records)} records of {topic}, short of {dict(ends)}")
            for msg in consumer.consume(1000, timeout=0.5):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() is not None or partition is None or offset is None or offset >= ends[partition]:
                    continue
                records.append((partition, offset, msg.key(), msg.value()))
                position[partition] = offset + 1
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r[0], r[1]))
