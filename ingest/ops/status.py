"""What ``ingest status`` and ``ingest segments`` show: the metastore's view, with Kafka's
watermarks beside it when Kafka answers."""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from ingest.config import Settings, admin_config, kafka_client, kafka_error, reader_config
from ingest.topics import kafka_topic_id
from ingest_common.model import DesiredState, WorkerState
from metastore import Metastore

WAITING_FOR_REGISTRY = "WAITING_FOR_SCHEMA_REGISTRY"
LOG_TRUNCATED = "LOG_TRUNCATED"
# A topic deleted and re-created under the partition's topic name (migrations/0027).
TOPIC_RECREATED = "TOPIC_RECREATED"
# The gaps whose partition stays stopped at their end (the stored offset): those before it are
# no longer the log's records.
_STOPPED_AT_END = ("log_truncated", "topic_recreated")
# A pattern source's partition of a deleted topic (migrations/0024): no lag, never stuck.
RETIRED = "RETIRED"
# What a watermark query of a partition Kafka does not know answers, at once.
_NO_SUCH_PARTITION = (KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART)


def watermarks(
    settings: Settings, tps: list[tuple[str, int]], timeout: float = 5.0
) -> dict[tuple[str, int], tuple[int, int]]:
    """Kafka's (low, high) watermarks per partition: none for a partition Kafka does not know
    (its topic deleted, not retired yet), and none after the first that Kafka does not answer
    for (every other query would wait its timeout too)."""
    if not tps or not settings.kafka_bootstrap:
        return {}
    consumer = kafka_client(Consumer, reader_config(settings, "ingest-status"))
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        for topic, partition in tps:
            try:
                low, high = consumer.get_watermark_offsets(KafkaTopicPartition(topic, partition), timeout=timeout)
            except KafkaException as exc:
                if (error := kafka_error(exc)) is not None and error.code() in _NO_SUCH_PARTITION:
                    continue
                return marks
            marks[(topic, partition)] = (int(low), int(high))
    finally:
        consumer.close()
    return marks


def topic_ids(settings: Settings, topics: list[str], timeout: float = 5.0) -> dict[str, str | None]:
    """Kafka's id (KIP-516, as Kafka prints it) of each topic it knows now (None: a cluster that
    gives topics no id); a topic Kafka does not know, or all when it does not answer, left out."""
    if not topics or not settings.kafka_bootstrap:
        return {}
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = kafka_client(AdminClient, admin_config(settings))
    try:
        futures = admin.describe_topics(TopicCollection(sorted(set(topics))), request_timeout=timeout)
    except KafkaException:
        return {}
    ids: dict[str, str | None] = {}
    for topic, future in futures.items():
        try:
            description = future.result(timeout=timeout)
        except (KafkaException, FutureTimeout):
            continue
        ids[topic] = kafka_topic_id(description)
    return ids


def partition_state(
    *,
    stopped_at_gap: bool,
    lag: int | None,
    last_publish_at: datetime | None,
    owner_started_at: datetime | None,
    now: datetime,
    stuck_after_s: float,
    past_log_end: bool = False,
    waiting_for_registry: bool = False,
    log_truncated: bool = False,
    topic_recreated: bool = False,
) -> str:
    """TOPIC_RECREATED, LOG_TRUNCATED, OFFSET_OUT_OF_RANGE (stopped at a gap, or the stored
    offset is past the log end), WAITING_FOR_SCHEMA_REGISTRY, STUCK or OK.

    TOPIC_RECREATED: a worker found Kafka's id of the partition's topic (KIP-516) other than the
    one stored with its offset: the topic was deleted and re-created under its name, and the new
    log's offsets below the stored one hold records never read. It stopped the partition; an
    unskipped gap with reason ``topic_recreated`` ends at the stored offset, naming both ids.

    LOG_TRUNCATED: a worker found Kafka's log truncated below the stored offset (KIP-320: the
    leader epoch stored with it ends below it) and stopped the partition; an unskipped gap with
    reason ``log_truncated`` ends at the stored offset. The log may have grown past the offset
    again, so neither the lag nor the watermarks show it.

    Past the log end: Kafka's log ends below the stored offset (an unclean leader election
    truncated it, the topic was re-created). A worker stops such a partition; its lag reads 0,
    so without this it would look caught up.

    STUCK: Kafka's watermark says there is data (lag > 0) and nothing was published for
    ``stuck_after_s`` — since the last publish, or since its owner started when it never
    published. That is a broker stalling silently, a fetcher that stopped, or builds that
    keep failing. A lag Kafka cannot tell (no watermark) is not evidence either way.

    WAITING_FOR_SCHEMA_REGISTRY: its owner reports (heartbeat) that a split of it waits for a
    schema registry that does not answer: paused, nothing rejected or skipped, it resumes by
    itself. More specific than STUCK, which it would become.
    """
    if topic_recreated:
        return TOPIC_RECREATED
    if log_truncated:
        return LOG_TRUNCATED
    if stopped_at_gap or past_log_end:
        return "OFFSET_OUT_OF_RANGE"
    if waiting_for_registry:
        return WAITING_FOR_REGISTRY
    since = last_publish_at or owner_started_at
    if lag and since is not None and (now - since).total_seconds() > stuck_after_s:
        return "STUCK"
    return "OK"


def source_status(store: Metastore, settings: Settings, source: str, errors: int = 10) -> dict[str, Any]:
    version, _spec = store.latest_spec(source)
    rows = store.partitions(source)
    # A retired partition's topic is gone: Kafka is not asked about it.
    marks = watermarks(settings, [(r["topic"], r["partition"]) for r in rows if r["retired_at"] is None])
    last_event = {(r["topic"], r["partition"]): r["last_event_time"] for r in store.partition_status(source)}
    offset_gaps = source_gaps(store, source)
    # A partition is stopped at a gap while an unskipped gap of its current epoch starts at its
    # stored offset (a stop of an earlier epoch was left behind by a reset).
    stopped_at = {
        (g["topic"], g["partition"], g["epoch"], g["from_offset"]): g
        for g in offset_gaps
        if not g["skipped"] and g["reason"] not in _STOPPED_AT_END
    }
    # ... or stopped by a truncation below its stored offset, or a re-created topic, where such
    # a gap ends.
    stopped_below = {
        (g["topic"], g["partition"], g["epoch"], g["to_offset"], g["reason"]): g
        for g in offset_gaps
        if not g["skipped"] and g["reason"] in _STOPPED_AT_END
    }
    live = store.live_workers(source)
    started = {w["worker"]: w["started_at"] for w in live}
    # Partitions each live worker holds back for the schema registry, with its last error.
    registry_waits = {
        (w["worker"], tp): w.get("registry_error") or "" for w in live for tp in w.get("registry_waiting") or ()
    }
    now = datetime.now(UTC)
    partitions = []
    total_lag = 0
    for r in rows:
        low, high = marks.get((r["topic"], r["partition"]), (None, None))
        next_offset = r["next_offset"]
        lag = None if high is None else max(0, high - (next_offset if next_offset is not None else (low or 0)))
        total_lag += lag or 0
        gap = stopped_at.get((r["topic"], r["partition"], r["epoch"], next_offset))
        truncated = stopped_below.get((r["topic"], r["partition"], r["epoch"], next_offset, "log_truncated"))
        recreated = stopped_below.get((r["topic"], r["partition"], r["epoch"], next_offset, "topic_recreated"))
        past_log_end = high is not None and next_offset is not None and next_offset > high
        registry_error = registry_waits.get((r["owner"], f"{r['topic']}[{r['partition']}]"))
        partitions.append(
            {
                "topic": r["topic"],
                "partition": r["partition"],
                "state": RETIRED
                if r["retired_at"] is not None
                else partition_state(
                    stopped_at_gap=gap is not None,
                    lag=lag,
                    last_publish_at=r["last_publish_at"],
                    owner_started_at=started.get(r["owner"]),
                    now=now,
                    stuck_after_s=settings.stuck_after_s,
                    past_log_end=past_log_end,
                    waiting_for_registry=registry_error is not None,
                    log_truncated=truncated is not None,
                    topic_recreated=recreated is not None,
                ),
                "registry_error": registry_error,
                "lost_range": None if gap is None else [gap["from_offset"], gap["to_offset"]],
                "truncated_range": None if truncated is None else [truncated["from_offset"], truncated["to_offset"]],
                # The topic re-created: the range of the new log never read, the stored id and Kafka's.
                "topic_recreated": None
                if recreated is None
                else {
                    "range": [recreated["from_offset"], recreated["to_offset"]],
                    "old_topic_id": recreated["old_topic_id"],
                    "new_topic_id": recreated["new_topic_id"],
                },
                "topic_id": r["topic_id"],
                "leader_epoch": r["leader_epoch"],
                "past_log_end": past_log_end,
                "next_offset": next_offset,
                "earliest_offset": low,
                "high_watermark": high,
                "lag": lag,
                "owner": r["owner"],
                "serial": r["serial"],
                "last_publish_at": _iso(r["last_publish_at"]),
                "last_event_time": _iso(last_event.get((r["topic"], r["partition"]))),
                # The current segment holding the last published range (a compaction re-points it).
                "last_segment_id": r["last_segment_id"],
                "initial_position": r["initial_position"],
                "retired_at": _iso(r["retired_at"]),
            }
        )
    workers = [
        {
            "worker": w["worker"],
            "host": w["host"],
            "pid": w["pid"],
            "version": w["version"],
            "state": w["state"],
            "partitions": list(w["partitions"]),
            "started_at": _iso(w["started_at"]),
            "heartbeat_at": _iso(w["heartbeat_at"]),
            "spec_version": w.get("spec_version"),
            "registry_waiting": list(w.get("registry_waiting") or ()),
            "registry_error": w.get("registry_error"),
        }
        for w in live
    ]
    recent = [
        {"worker": e["worker"], "kind": e["kind"], "message": e["message"], "at": _iso(e["at"])}
        for e in store.recent_errors(source, errors)
    ]
    kafka_reachable = bool(marks) or all(r["retired_at"] is not None for r in rows)
    control = store.control(source)
    if control.desired_state is DesiredState.SUSPENDED:
        # Paused on purpose: lag that does not shrink is what suspend means, not a stall.
        for p in partitions:
            if p["state"] == "STUCK":
                p["state"] = "SUSPENDED"
    state, detail = _state(partitions, workers, kafka_reachable, total_lag, control.desired_state)
    resets = [
        {
            "id": r["id"],
            "actor": r["actor"],
            "reason": r["reason"],
            "target": r["target"],
            "at": _iso(r["at"]),
            "partitions": r["partitions"],
        }
        for r in store.recent_resets(source, 5)
    ]
    # Pending segments a table cannot take (ingest.table.refusals): the table lacks their records.
    refused = [
        {
            "table": r["kind"],
            "segment_id": r["segment_id"],
            "error": r["error"],
            "attempts": r["attempts"],
            "first_at": _iso(r["first_at"]),
            "last_at": _iso(r["last_at"]),
        }
        for r in store.table_refusals(source)
    ]
    return {
        "source": source,
        "state": state,
        "detailed_state": detail,
        "spec_version": version,
        "kafka_reachable": kafka_reachable,
        "total_lag": total_lag,
        "publish_conflicts": store.conflict_counts(source),
        "workers": workers,
        "partitions": partitions,
        "offset_gaps": offset_gaps,
        "unacknowledged_gaps": sum(1 for g in offset_gaps if g["acknowledged_at"] is None),
        "recent_errors": recent,
        "desired_state": control.desired_state,
        "recent_resets": resets,
        "table_refused_segments": refused,
    }


def _state(
    partitions: list[dict[str, Any]],
    workers: list[dict[str, Any]],
    kafka_reachable: bool,
    total_lag: int,
    desired_state: DesiredState = DesiredState.RUNNING,
) -> tuple[str, str]:
    """The source's state and why, Druid-supervisor style. What an operator asked for
    (suspend, terminate) wins over what a running source would be judged by."""
    if desired_state.terminal:
        return desired_state.upper(), desired_state.upper()
    if desired_state is DesiredState.SUSPENDED:
        if any(p["state"] == "OFFSET_OUT_OF_RANGE" for p in partitions):
            return "SUSPENDED", "OFFSET_OUT_OF_RANGE"
        return "SUSPENDED", "SUSPENDED"
    if not partitions and not workers:
        return "PENDING", "NO_WORKERS"
    if not workers:
        return "UNHEALTHY", "NO_WORKERS"
    if not kafka_reachable:
        return "UNHEALTHY", "UNABLE_TO_CONNECT_TO_STREAM"
    if any(p["state"] == TOPIC_RECREATED for p in partitions):
        return "UNHEALTHY", TOPIC_RECREATED
    if any(p["state"] == LOG_TRUNCATED for p in partitions):
        return "UNHEALTHY", LOG_TRUNCATED
    if any(p["state"] == "OFFSET_OUT_OF_RANGE" for p in partitions):
        return "UNHEALTHY", "OFFSET_OUT_OF_RANGE"
    if any(p["state"] == WAITING_FOR_REGISTRY for p in partitions):
        # Like an unreachable Kafka: an outside service stops ingestion, which resumes by itself.
        return "UNHEALTHY", "SCHEMA_REGISTRY_UNAVAILABLE"
    if any(w["state"] == WorkerState.UNHEALTHY for w in workers):
        return "UNHEALTHY", "SPLITS_FAILING"
    if any(p["state"] == "STUCK" for p in partitions):
        return "UNHEALTHY", "STUCK_PARTITIONS"
    if all(w["state"] == WorkerState.DRAINING for w in workers):
        return "DRAINING", "DRAINING"
    if total_lag == 0:
        return "IDLE", "CAUGHT_UP"
    return "RUNNING", "RUNNING"


def source_gaps(store: Metastore, source: str) -> list[dict[str, Any]]:
    store.latest_spec(source)  # raises SourceNotFound for an unknown source
    return [
        {
            "id": g["id"],
            "topic": g["topic"],
            "partition": g["partition"],
            # A gap belongs to the epoch its partition was in (a reset starts the next one).
            "epoch": g["epoch"],
            "from_offset": g["from_offset"],
            "to_offset": g["to_offset"],
            "lost_records": g["to_offset"] - g["from_offset"],
            "skipped": g["skipped"],
            "reason": g["reason"],
            # A re-created topic's gap: the topic id stored with the offset, and Kafka's then.
            "old_topic_id": g.get("old_topic_id"),
            "new_topic_id": g.get("new_topic_id"),
            "worker": g["worker"],
            "detected_at": _iso(g["detected_at"]),
            "skipped_at": _iso(g["skipped_at"]),
            "acknowledged_at": _iso(g["acknowledged_at"]),
            "acknowledged_by": g["acknowledged_by"],
        }
        for g in store.gaps(source)
    ]


def source_segments(
    store: Metastore, source: str, since: datetime | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    store.latest_spec(source)  # raises SourceNotFound for an unknown source
    out = []
    for r in store.segments(source, since, limit):
        out.append(
            {
                "id": r["id"],
                "split_id": str(r["split_id"]),
                "spec_version": r["spec_version"],
                "worker": r["worker"],
                "location": r["location"],
                "files": list(r["files"]),
                "rows": r["row_count"],
                "bytes": r["size_bytes"],
                "rejects": r["rejects_count"],
                "rejects_files": list(r["rejects_files"]),
                "skipped": r["skipped_count"],
                "min_event_time": _iso(r["min_event_time"]),
                "max_event_time": _iso(r["max_event_time"]),
                "published_at": _iso(r["published_at"]),
                "ranges": [
                    {"topic": x["topic"], "partition": x["partition"], "start": x["start"], "end": x["end"]}
                    for x in r["ranges"]
                ],
            }
        )
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
