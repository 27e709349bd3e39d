"""The chaos run's Avro records (tests/chaos_avro.py) against a real registry, Kafka and Spark:
every writer version, built with the chaos run's own spec, becomes exactly the row the chaos
run's payload check expects (what ``--format avro`` relies on to check payloads as the JSON run does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.spec.parse import load_spec_file
from ingest_common.model import TopicPartition
from tests.acceptance.harness import write_spec
from tests.chaos_avro import AVRO_VERSIONS, avro_values, version_of
from tests.chaos_records import expected_row, record_fields
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_over

RECORDS = 30


def test_every_writer_version_becomes_the_expected_row(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, schema_registry_url: str
) -> None:
    topic = make_topic(partitions=1, prefix="chaos")
    value = avro_values(schema_registry_url, topic, RECORDS, record_fields)
    assert {version_of(i, RECORDS) for i in range(RECORDS)} == set(range(len(AVRO_VERSIONS)))
    _, path = write_spec(tmp_path, topic, extra=f'format = "avro"\n\n[registry]\nurl = "{schema_registry_url}"\n')
    spec, _ = load_spec_file(path)
    offsets = produce(kafka_bootstrap, TopicPartition(topic, 0), [(str(i).encode(), value(i)) for i in range(RECORDS)])
    segment = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert (segment.row_count, segment.rejects_count) == (RECORDS, 0)
    rows = pa.concat_tables([pq.read_table(f) for f in segment.files]).sort_by("_offset").to_pylist()
    columns = list(expected_row(0))
    assert [{c: row[c] for c in columns} for row in rows] == [expected_row(i) for i in range(RECORDS)]
