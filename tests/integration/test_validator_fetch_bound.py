"""The position validator (ingest.consume.validator) asks the broker whether a position is still
in the log by fetching from it; what it receives is dropped. On a real broker with a backlog of
large record batches, its consumer (``ingest.config.validator_config``) receives about one
batch per answer, not the backlog librdkafka would prefetch by default (up to
``queued.min.messages`` records): the worker that reads no record keeps reading none."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Consumer as KafkaConsumer

from ingest.config import Settings, validator_config
from ingest.consume.validator import ConfluentValidator, Validation, Verdict
from ingest_common.model import TopicPartition
from ingest_dev.kafka_clients import create_topic, produce_records, record_leader_epochs
from ingest_dev.testkit import wait_until

BATCHES, PER_BATCH, VALUE = 40, 1_000, b"v" * 200  # 8 MB of values in batches of ~200 kB


def test_a_validation_receives_about_one_batch_of_a_large_backlog(kafka_bootstrap: str) -> None:
    topic = f"validate-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    produce_records(kafka_bootstrap, topic, [(0, b"k", VALUE)])
    [epoch] = record_leader_epochs(kafka_bootstrap, topic, 0)  # read record by record: before the backlog
    for _ in range(BATCHES):  # one flush per batch: each a record batch of its own
        produce_records(kafka_bootstrap, topic, ((0, b"k", VALUE) for _ in range(PER_BATCH)))
    batch_bytes = PER_BATCH * len(VALUE)

    settings = Settings.from_env(
        {"INGEST_DATABASE_URL": "postgresql://h/db", "INGEST_KAFKA_BOOTSTRAP": kafka_bootstrap}
    )
    received: list[int] = []
    conf = {
        **validator_config(settings, f"validator-{uuid.uuid4().hex[:8]}"),
        "statistics.interval.ms": 100,
        "stats_cb": lambda stats: received.append(int(json.loads(stats)["rxmsg_bytes"])),
    }
    validator = ConfluentValidator(KafkaConsumer(conf))
    try:
        tp = TopicPartition(topic, 0)
        validator.validate(tp, 0, epoch)
        answers: list[Validation] = []
        wait_until(lambda: answers.extend(validator.poll()) or answers, 60, "the validation's answer", interval=0.05)
        assert [a.verdict for a in answers] == [Verdict.VALID]
        # What was in flight when the answer came lands too; then nothing more is fetched.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            validator.poll()
            time.sleep(0.05)
    finally:
        validator.close()
    assert received, "librdkafka emitted no statistics"
    assert 0 < max(received) <= 3 * batch_bytes, (max(received), batch_bytes)
