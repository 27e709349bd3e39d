"""The build stage of a source, started as a worker starts it: Spark's Kafka reader with the
worker's client settings, the role's Spark session (local, standalone or Spark Connect), the
writer schemas of its registry subjects, and the builder over them. ``ingest check --spark``
starts the same, so what it proves is what a worker will run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog

from ingest.builder.job import SparkSegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.builder.registration import BuildRegistrar
from ingest.builder.writer_schemas import WriterSchemas
from ingest.config import Settings
from ingest.errors import SparkUnavailable
from ingest.spark.session import SessionSource
from ingest.spec.model import SourceSpec
from ingest_common.model import SparkConnectEvent

log = structlog.get_logger(__name__)


def spark_reader(settings: Settings, spec: SourceSpec, properties: Mapping[str, str]) -> KafkaReader:
    """Spark's Kafka reader of the source: ``properties`` are the Java client's
    (ingest.kafka_java); its consumers are pooled under one group id per source."""
    return KafkaReader.of(
        settings.kafka_bootstrap,
        f"{spec.group_id}-spark",
        properties,
        poll_timeout_ms=int(settings.spark_kafka_poll_timeout_s * 1000),
    )


def prefetch_writer_schemas(schemas: WriterSchemas, spec: SourceSpec, topics: Sequence[str]) -> None:
    """The writer schemas of the topics' subjects, so that the first builds decode with them (a
    pattern source's topic that appears later has its writers fetched by its first build)."""
    if spec.registry is None:
        return
    subjects = [f"{t}-value" for t in topics] if spec.format in ("avro", "protobuf") else []
    if spec.registry.subject_strategy == "record" and spec.registry.record_name:
        subjects = [spec.registry.record_name]
    learned = schemas.prefetch(spec.registry, subjects, protobuf=spec.format == "protobuf")
    if spec.key_format == "avro":
        learned += schemas.prefetch(spec.registry, [f"{t}-key" for t in topics])
    log.info("writer_schemas_prefetched", source=spec.name, schemas=learned)


def start_spark_builder(
    settings: Settings,
    spec: SourceSpec,
    registrar: BuildRegistrar,
    reader: KafkaReader,
    on_event: Callable[[SparkConnectEvent], None] = lambda _event: None,
    topics: Sequence[str] | None = None,
) -> tuple[SparkSegmentBuilder, SessionSource]:
    """The source's builder and the session source it builds on (the caller stops it). A Spark
    that does not start within INGEST_SPARK_START_TIMEOUT_S is :class:`SparkUnavailable`.
    ``topics``: those whose writer schemas are prefetched (default: the spec's named topics)."""
    from ingest.spark.start import open_session_source

    log.info(
        "spark_starting", source=spec.name, spark_master=settings.spark_master, timeout_s=settings.spark_start_timeout_s
    )
    try:
        sessions = open_session_source(
            settings,
            f"ingest-{spec.name}",
            [spec.segment_store],
            # Spark's Kafka source and spark-avro are in the pinned jar set.
            connectors=True,
            on_event=on_event,
        )
    except Exception as exc:  # pyspark raises Py4J, OS and its own errors here
        raise SparkUnavailable(settings.spark_master, exc) from exc
    try:
        schemas = WriterSchemas(wait_s=settings.schema_id_wait_s)
        prefetch_writer_schemas(schemas, spec, spec.topics if topics is None else topics)
    except BaseException:
        sessions.stop()
        raise
    builder = SparkSegmentBuilder(
        sessions, registrar, reader, writer_schemas=schemas, deadline_s=settings.build_deadline_s
    )
    return builder, sessions
