"""Names in the SQL text the product builds (ingest.table.spark_catalog) and the topics a
principal may not see (ingest.topics.source_topics), without a server: the servers' side is
tests/integration/test_upsert_table.py (a source ``dbz-mysql``, ``order`` keyed by ``select``)
and tests/acceptance/test_kafka_acls.py (a broker with ACLs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from ingest.errors import KafkaUnavailable, TopicNotFound
from ingest.table.spark_catalog import quoted, spark_table_name, sql_string
from ingest.topics import source_topics
from metastore.tables import TableKind


def test_identifiers_are_backquoted_with_backquotes_doubled_and_strings_escaped() -> None:
    assert quoted("dbz-mysql") == "`dbz-mysql`"
    assert quoted("a`b") == "`a``b`"
    assert spark_table_name("order") == "`ingest`.`ingest`.`order`"
    assert spark_table_name("dbz-mysql", TableKind.REJECTS) == "`ingest`.`ingest_rejects`.`dbz-mysql`"
    assert sql_string("it's") == "'it\\'s'"
    assert sql_string("a\\b") == "'a\\\\b'"


def _spec(topic: str) -> SimpleNamespace:
    return SimpleNamespace(topics=(topic,), topic_pattern="", matches=lambda t: t == topic)


def test_a_topic_the_metadata_leaves_out_is_not_authorized_when_describing_it_is_refused() -> None:
    empty = SimpleNamespace(topics={})
    with pytest.raises(KafkaUnavailable, match=r"topic 't': not authorized \(TOPIC_AUTHORIZATION_FAILED"):
        source_topics(_spec("t"), empty, "b:9092", refused=lambda topic: True)
    with pytest.raises(TopicNotFound, match="does not exist"):
        source_topics(_spec("t"), empty, "b:9092", refused=lambda topic: False)
    with pytest.raises(TopicNotFound, match="does not exist"):
        source_topics(_spec("t"), empty, "b:9092")
    refused = SimpleNamespace(
        topics={"t": SimpleNamespace(error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), partitions={})}
    )
    with pytest.raises(KafkaUnavailable, match="no ACL allowing DESCRIBE on topic 't'"):
        source_topics(_spec("t"), refused, "b:9092")
