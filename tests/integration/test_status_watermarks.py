"""``ingest status``'s watermarks against a real broker: a partition Kafka does not know (a
topic deleted, its rows not retired yet) costs nothing and hides none of the others."""

from __future__ import annotations

from ingest.config import Settings
from ingest.ops.status import watermarks
from tests.fixtures.servers import MakeTopic


def test_a_partition_kafka_does_not_know_hides_no_other_watermark(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = make_topic(partitions=2)
    settings = Settings(database_url="postgresql://unused", kafka_bootstrap=kafka_bootstrap)
    marks = watermarks(settings, [("no-such-topic", 0), (topic, 7), (topic, 0), (topic, 1)])
    assert marks == {(topic, 0): (0, 0), (topic, 1): (0, 0)}
