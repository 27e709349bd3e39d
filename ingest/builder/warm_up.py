"""A worker's first build before it joins its group: a young JVM makes the first splits slow
(class loading, JIT, code generation: seconds), so the worker first builds, and throws away,
up to ``records`` of its source's newest records. They are real records of real partitions,
read from Kafka as every build reads them: the JIT compiles the paths real records take (the
Kafka reader, the parse of this source's format, the write), on several executor threads
(one split per partition, several partitions), and the executors' Kafka consumers are made
and pooled. Nothing of it is published: the build registers (gc deletes what is left) and its
files are deleted at once. Spark's Kafka reader refused by the brokers' authentication stops
the start (ingest.kafka_auth): the real builds would only retry it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import structlog

from ingest.builder.job import SegmentBuilder
from ingest.errors import ParseFailure
from ingest.kafka_auth import java_refusal, spark_reader_refused
from ingest.segments import store as segment_store
from ingest.spec.model import SourceSpec
from ingest.splits.kill_switch import KillSwitch
from ingest.splits.split import SealedSplit
from ingest_common.model import BuiltSegment, TopicPartition

log = structlog.get_logger(__name__)


def warm_up_splits(
    logs: Mapping[TopicPartition, tuple[int, int]],
    records: int,
    partitions: int = 2,
    topic_ids: Mapping[str, str] | None = None,
) -> list[SealedSplit]:
    """Splits of the newest ``records`` offsets, dealt over up to ``partitions`` partitions of
    those that hold any (``logs``: each partition's earliest and last stable offset), with
    their topics' ids where known (the read's group id is the real builds': their pool)."""
    holding = sorted((tp for tp, (low, stable) in logs.items() if stable > low), key=lambda tp: -logs[tp][1])
    chosen = holding[:partitions]
    if not chosen or records <= 0:
        return []
    per = max(1, records // len(chosen))
    now = time.monotonic()
    return [
        SealedSplit(
            id=uuid.uuid4(),
            tp=tp,
            serial=0,
            start=max(logs[tp][0], logs[tp][1] - per),
            end=logs[tp][1],
            leader_epoch=None,
            estimated_bytes=0,
            available_at=now,
            sealed_at=now,
            seal_reason="warm_up",
            kill_switch=KillSwitch(),
            topic_id=(topic_ids or {}).get(tp.topic),
        )
        for tp in chosen
    ]


def warm_up(builder: SegmentBuilder, spec: SourceSpec, splits: list[SealedSplit]) -> float:
    """Build ``splits`` and delete what they wrote; the seconds it took. A split that fails
    says why in the log (the real builds report it again, with retries), but one that Kafka's
    authentication refused raises KafkaUnavailable."""
    started = time.monotonic()
    for split, result in zip(splits, builder.build_batch(splits, spec), strict=True):
        if isinstance(result, BuiltSegment):
            segment_store.discard(result)
        elif (reason := java_refusal(str(result))) is not None:
            raise spark_reader_refused(reason)
        elif not isinstance(result, ParseFailure):  # policy "fail" stops at a bad record: the path ran
            log.warning("spark_warm_up_split_failed", source=spec.name, partition=str(split.tp), error=str(result))
    return time.monotonic() - started
