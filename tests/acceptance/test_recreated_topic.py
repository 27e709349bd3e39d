"""A topic deleted and re-created under the same name, against the real broker: the new log's
offsets start again at 0 and its leader epoch too, so the stored offset and its leader epoch
(KIP-320) match it as they matched the old one; only Kafka's topic id (KIP-516) tells them
apart. A worker that published [0, 20) of the old topic must neither resume at 20 in the new one
(skipping its records at [0, 20), with nothing to show for it) nor read anything of it: the
partition stops, with both ids recorded and shown by ``ingest status``, while the worker runs
and when the next one claims it. ``ingest reset --to earliest`` records the new id, and the
worker reads the new topic from its start."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from ingest.builder.kafka_read import KafkaReader
from ingest.builder.registration import BuildRegistrar
from ingest.ops.status import source_status
from ingest_common.model import TopicPartition
from ingest_dev.kafka_clients import create_topic, delete_topics, produce_records
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import StartWorker, apply_spec, process_env, sample_value, settings, write_spec
from tests.acceptance.test_cli import ingest
from tests.fakes import FakeBuilder

PUBLISHED = 20  # records of the old topic, published
NEW_RECORDS = 30  # records of the re-created topic: its log ends past the stored offset


def topic_id(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return str(admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(timeout=10).topic_id)


def recreate(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again once the cluster no longer lists it."""
    delete_topics(bootstrap, [topic])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, 30, f"{topic} deleted", interval=0.1)
    create_topic(bootstrap, topic, 1)


def test_a_recreated_topic_stops_its_partition_until_a_reset_reads_the_new_one(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    start_worker: StartWorker,
) -> None:
    url, bootstrap = database_url, kafka_bootstrap
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    produce_records(bootstrap, topic, ((0, str(i).encode(), sample_value(i)) for i in range(PUBLISHED)))
    old_id = topic_id(bootstrap, topic)
    # "earliest" would skip a retention gap: a re-created topic is no such gap.
    source, spec_path = write_spec(
        tmp_path, topic, max_records=5, max_age="200ms", extra='on_offset_out_of_range = "earliest"'
    )
    apply_spec(url, spec_path)
    fast = settings(url, bootstrap)

    def partition() -> dict[str, object]:
        with Metastore(url) as store:
            [row] = store.partitions(source)
            return dict(row)

    def recreated_errors() -> int:
        with Metastore(url) as store:
            return sum(e["kind"] == "TOPIC_RECREATED" for e in store.recent_errors(source))

    builders: list[FakeBuilder] = []  # each records every split it is given

    def builder(registrar: BuildRegistrar, _reader: KafkaReader) -> FakeBuilder:
        builders.append(FakeBuilder(registrar))
        return builders[-1]

    first = start_worker(fast, source, builder)
    wait_until(lambda: partition()["next_offset"] == PUBLISHED, 60, "the old topic published")
    assert partition()["topic_id"] == old_id  # recorded by the claim
    assert {s.topic_id for s in builders[0].built} == {old_id}

    # The topic is deleted and re-created under the running worker; the new log grows past 20.
    recreate(bootstrap, topic)
    new_id = topic_id(bootstrap, topic)
    assert new_id != old_id
    produce_records(bootstrap, topic, ((0, str(i).encode(), sample_value(1000 + i)) for i in range(NEW_RECORDS)))
    wait_until(
        lambda: recreated_errors() > 0 or partition()["next_offset"] != PUBLISHED,
        60,
        "the re-created topic found (or the stored offset moved)",
    )
    time.sleep(1.0)  # the worker's next log-end answers: nothing may follow the stop
    assert partition()["next_offset"] == PUBLISHED and partition()["topic_id"] == old_id
    assert [(s.start, s.end) for s in builders[0].built if s.end > PUBLISHED or s.topic_id != old_id] == []
    assert first.error is None and first.thread.is_alive()
    first.stop()

    # The next worker's claim finds it too: stopped before anything is validated or cut.
    second = start_worker(settings(url, bootstrap), source, builder)
    wait_until(lambda: recreated_errors() >= 2, 60, "the claim's finding")
    with Metastore(url) as store:
        status = source_status(store, fast, source)
        gaps = [
            (g["from_offset"], g["to_offset"], g["skipped"], g["reason"], g["old_topic_id"], g["new_topic_id"])
            for g in store.gaps(source)
        ]
        assert store.segments(source) and all(
            r["end"] <= PUBLISHED for s in store.segments(source) for r in s["ranges"]
        )
    assert gaps == [(0, PUBLISHED, False, "topic_recreated", old_id, new_id)]
    assert builders[1].built == []
    p0 = status["partitions"][0]
    assert (p0["state"], p0["next_offset"], p0["high_watermark"]) == ("TOPIC_RECREATED", PUBLISHED, NEW_RECORDS)
    assert p0["topic_recreated"] == {"range": [0, PUBLISHED], "old_topic_id": old_id, "new_topic_id": new_id}
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "TOPIC_RECREATED")
    message = status["recent_errors"][0]["message"]
    assert f"{tp}: the topic was deleted and re-created: Kafka's topic id is {new_id}" in message, message
    assert f"the stored offset {PUBLISHED} was read from topic id {old_id}" in message, message

    env = process_env(url, bootstrap)
    shown = ingest(env, "status", source)
    assert "TOPIC_RECREATED" in shown.stdout and new_id in shown.stdout and old_id in shown.stdout, shown.stdout

    # `ingest reset --to earliest` records the new topic's id: the worker reads it from 0.
    reset = ingest(env, "reset", source, "--to", "earliest", "--reason", "topic re-created", "--yes")
    assert reset.returncode == 0, reset.stderr
    wait_until(lambda: partition()["next_offset"] == NEW_RECORDS, 60, "the new topic read")
    assert partition()["topic_id"] == new_id
    read = sorted((s.start, s.end) for s in builders[1].built)
    assert [lo for lo, _ in read] == [0, *(hi for _, hi in read[:-1])] and read[-1][1] == NEW_RECORDS, read
    assert {s.topic_id for s in builders[1].built} == {new_id}
    assert second.error is None
    second.stop()
    audit = ingest(env, "audit", source)
    assert audit.returncode == 0, audit.stdout + audit.stderr
