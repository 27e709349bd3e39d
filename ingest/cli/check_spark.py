"""``ingest check --spark``: the source's build stage started as a worker starts it
(ingest.builder.start), then one build of a few of the newest records of up to two partitions,
read by Spark's executors from Kafka with the properties derived from the worker's, parsed by
the source's format and written to its store; the files are deleted at once and nothing is
published (the build registers, as every build does: gc deletes what a crash leaves)."""

from __future__ import annotations

import contextlib

from confluent_kafka.admin import AdminClient

from ingest.builder.registration import Registrar
from ingest.builder.start import spark_reader, start_spark_builder
from ingest.builder.warm_up import warm_up_splits
from ingest.config import Settings, admin_config, kafka_client
from ingest.consume.log_offsets import AdminLogOffsets
from ingest.errors import BuildError, KafkaUnavailable, ParseFailure
from ingest.kafka_auth import java_refusal, spark_reader_refused
from ingest.kafka_java import java_client_properties, java_secret_values
from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.topics import fetch_source_topics
from ingest_common.errors import cause_line
from ingest_common.model import BuiltSegment, TopicPartition
from ingest_common.redact import register_secrets
from metastore import Metastore

# How long the newest offsets are waited for.
_QUERY_S = 10.0


def build_newest(settings: Settings, spec: SourceSpec, records: int) -> str:
    properties = java_client_properties(settings.kafka_properties, settings.spark_reader_properties)
    register_secrets(java_secret_values(properties))
    counts = fetch_source_topics(settings, spec)
    tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
    offsets = AdminLogOffsets(kafka_client(AdminClient, admin_config(settings)))
    try:
        query = offsets.query(tps)
        if not query.wait(_QUERY_S):
            raise KafkaUnavailable(f"the log ends of {', '.join(counts)} were not answered within {_QUERY_S:g} s")
        ends, _errors = query.result()
    finally:
        offsets.close()
    splits = warm_up_splits({tp: (e.earliest, e.stable) for tp, e in ends.items()}, records)
    if not splits:
        return "no records in the source's topics to build (Spark not started)"
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(Metastore(settings.database_url))
        registrar = Registrar(store, f"{settings.worker_id}-check")
        builder, sessions = start_spark_builder(
            settings, spec, registrar, spark_reader(settings, spec, properties), topics=list(counts)
        )
        stack.callback(sessions.stop)
        rows = rejects = 0
        for split, result in zip(splits, builder.build_batch(splits, spec), strict=True):
            if isinstance(result, BuiltSegment):
                segment_store.discard(result)
                rows += result.row_count
                rejects += result.rejects_count + result.skipped_count
                continue
            if (reason := java_refusal(str(result))) is not None:
                raise spark_reader_refused(reason)
            if isinstance(result, ParseFailure):
                raise result
            raise BuildError(f"building {split.tp}[{split.start}, {split.end}): {cause_line(result)}")
    covered = sum(s.end - s.start for s in splits)
    return (
        f"{settings.spark_master}: built {covered} of the newest offsets of {len(splits)} partition(s)"
        f" ({rows} rows, {rejects} rejected or skipped), deleted"
    )
