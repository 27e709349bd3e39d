"""Every metric the worker exports, defined in one place.

Each worker owns its own registry so that several workers in one process (tests) never
share counters. Per-partition series are removed when the partition leaves the worker.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ingest.spark.session import spark_connect_events_counter
from ingest_common.model import (
    PARSE_ERRORS,
    BuiltSegment,
    ConflictReason,
    FailureStage,
    GapAction,
    KillReason,
    LastAudit,
    RebalanceKind,
    SparkConnectEvent,
    TopicPartition,
    WorkerState,
)

_BUILD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_PUBLISH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5)
_ROWS_BUCKETS = (100, 1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 5_000_000)
_BYTES_BUCKETS = tuple(float(2**n) for n in range(16, 34, 2))
_LATENCY_BUCKETS = (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600)
# Counted when a builder reports rejects or skips without saying why.
UNKNOWN_REASON = "unknown"


class Metrics:
    def __init__(self, source: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.source = source
        self.records_consumed = Counter(
            "ingest_records_consumed",
            "Records Spark read from Kafka for the published splits (counted at their publish)",
            ["source"],
            registry=r,
        )
        self.bytes_consumed = Counter(
            "ingest_bytes_consumed",
            "Bytes of the keys and values Spark read from Kafka for the published splits",
            ["source"],
            registry=r,
        )
        self.records_fetched_by_worker = Counter(
            "ingest_worker_records_fetched",
            "Records the worker's own consumer received (never used: its partitions are paused, Spark reads)",
            ["source"],
            registry=r,
        )
        # From librdkafka's statistics (statistics.interval.ms): what the worker's own Kafka clients
        # received, by client (the group member, the position validator).
        self.kafka_client_received_bytes = Gauge(
            "ingest_kafka_client_received_message_bytes",
            "Message bytes a Kafka client of the worker received since it started (librdkafka's rxmsg_bytes)",
            ["source", "client"],
            registry=r,
        )
        self.records_published = Counter(
            "ingest_records_published", "Rows in published segments", ["source"], registry=r
        )
        self.records_rejected = Counter(
            "ingest_records_rejected", "Records published to rejects segments", ["source", "reason"], registry=r
        )
        self.records_skipped = Counter(
            "ingest_records_skipped", "Unparseable records skipped (policy skip)", ["source", "reason"], registry=r
        )
        self.segments_published = Counter("ingest_segments_published", "Segments published", ["source"], registry=r)
        self.publish_conflicts = Counter(
            "ingest_publish_conflicts", "Publishes refused by the metastore", ["source", "reason"], registry=r
        )
        self.splits_killed = Counter(
            "ingest_splits_killed", "Splits abandoned before publishing", ["source", "reason"], registry=r
        )
        self.split_failures = Counter(
            "ingest_split_failures", "Split builds or publishes that failed", ["source", "stage"], registry=r
        )
        self.offset_gap_records = Counter(
            "ingest_offset_gap_records",
            "Offsets no longer in the log when needed (gap ledger), by action "
            "(stopped: partition stopped; skipped: policy earliest)",
            ["source", "action"],
            registry=r,
        )
        self.rebalances = Counter("ingest_rebalances", "Rebalance callbacks", ["source", "kind"], registry=r)
        self.rebalance_seconds = Histogram(
            "ingest_rebalance_callback_seconds",
            "Time spent in rebalance callbacks",
            ["source", "kind"],
            buckets=(*_PUBLISH_BUCKETS, 10, 30),
            registry=r,
        )
        self.metastore_errors = Counter(
            "ingest_metastore_errors", "Metastore calls that failed", ["source"], registry=r
        )
        self.group_commits = Counter(
            "ingest_group_commits",
            "Published offsets committed to the consumer group as advice for Kafka's "
            "tools (never read back), by result",
            ["source", "result"],
            registry=r,
        )
        self.spark_connect_events = spark_connect_events_counter(r)
        self.kafka_errors = Counter(
            "ingest_kafka_errors", "Errors reported by the Kafka client", ["source"], registry=r
        )
        self.assigned_partitions = Gauge(
            "ingest_assigned_partitions", "Partitions assigned to this worker", ["source"], registry=r
        )
        self.paused_partitions = Gauge(
            "ingest_paused_partitions",
            "Owned partitions no split is cut from now (backpressure, a hold, fencing, a stop, a registry wait)",
            ["source"],
            registry=r,
        )
        self.inflight_splits = Gauge(
            "ingest_inflight_splits", "Sealed splits not yet published", ["source"], registry=r
        )
        self.inflight_bytes = Gauge(
            "ingest_inflight_bytes", "Estimated bytes of sealed splits not yet published", ["source"], registry=r
        )
        self.buffered_bytes = Gauge(
            "ingest_buffered_bytes",
            "Estimated bytes of stable offsets in the log not cut into splits yet",
            ["source"],
            registry=r,
        )
        self.partition_next_offset = Gauge(
            "ingest_partition_next_offset", "Next offset to publish", ["source", "topic", "partition"], registry=r
        )
        self.partition_lag_records = Gauge(
            "ingest_partition_lag_records",
            "Last stable offset minus the next offset to publish",
            ["source", "topic", "partition"],
            registry=r,
        )
        self.partition_lag_seconds = Gauge(
            "ingest_partition_lag_seconds",
            "How long the oldest offset not yet published has been in the log (0: none)",
            ["source", "topic", "partition"],
            registry=r,
        )
        self.worker_up = Gauge("ingest_worker_up", "1 while the worker runs its loop", ["source"], registry=r)
        # Only for sources with a [registry] section (set by ingest.consume.registry_watch).
        self.schema_registry_up = Gauge(
            "ingest_schema_registry_up",
            "0 while splits of this worker wait for the schema registry (it did not answer), else 1",
            ["source"],
            registry=r,
        )
        self.schema_registry_waiting_partitions = Gauge(
            "ingest_schema_registry_waiting_partitions",
            "Partitions paused because their splits wait for the schema registry",
            ["source"],
            registry=r,
        )
        self.worker_state = Gauge(
            "ingest_worker_state",
            "The worker's state: 1 for the current one, 0 for the others",
            ["source", "state"],
            registry=r,
        )
        self.build_seconds = Histogram(
            "ingest_split_build_seconds",
            "Spark build time of the batch that built the split",
            ["source"],
            buckets=_BUILD_BUCKETS,
            registry=r,
        )
        self.publish_seconds = Histogram(
            "ingest_publish_transaction_seconds",
            "Publish transaction time",
            ["source"],
            buckets=_PUBLISH_BUCKETS,
            registry=r,
        )
        self.visible_latency = Histogram(
            "ingest_produce_to_visible_seconds",
            "From a record's Kafka timestamp to its segment being published (newest record of each segment)",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.segment_rows = Histogram(
            "ingest_segment_rows", "Rows per published segment", ["source"], buckets=_ROWS_BUCKETS, registry=r
        )
        self.segment_bytes = Histogram(
            "ingest_segment_bytes", "Bytes per published segment", ["source"], buckets=_BYTES_BUCKETS, registry=r
        )
        # The source's last `ingest audit`, as read with the heartbeat (every worker of the
        # source exports the same values: the one-shot command cannot be scraped).
        self.audit_findings = Gauge(
            "ingest_audit_findings", "Findings of the source's last `ingest audit`", ["source"], registry=r
        )
        self.audit_last_run = Gauge(
            "ingest_audit_last_run_timestamp_seconds",
            "When the source's last `ingest audit` finished (Unix time; 0: never)",
            ["source"],
            registry=r,
        )
        self.audit_last_run.labels(source).set(0)

        # Every reason and state exists from the start (at 0), so rate() and alerts see the first increase.
        for reason in PARSE_ERRORS:
            self.records_rejected.labels(source, reason)
            self.records_skipped.labels(source, reason)
        for result in ("ok", "failed"):
            self.group_commits.labels(source, result)
        for counter, values in (
            (self.splits_killed, KillReason),
            (self.publish_conflicts, ConflictReason),
            (self.split_failures, FailureStage),
            (self.rebalances, RebalanceKind),
            (self.offset_gap_records, GapAction),
            (self.spark_connect_events, SparkConnectEvent),
        ):
            for value in values:
                counter.labels(source, value.value)
        self.set_worker_state(WorkerState.STARTING)

    def set_worker_state(self, state: WorkerState) -> None:
        """One-hot: the state's series is 1, every other WorkerState's is 0."""
        for known in WorkerState:
            self.worker_state.labels(self.source, known.value).set(1 if known is state else 0)

    def set_audit(self, audit: LastAudit | None) -> None:
        """The source's last audit: findings absent until there is one."""
        if audit is not None:
            self.audit_findings.labels(self.source).set(audit.findings)
            self.audit_last_run.labels(self.source).set(audit.finished_at.timestamp())

    def count_parse_errors(self, segment: BuiltSegment) -> None:
        """Rejected and skipped records of a published segment, by reason."""
        for counter, total in (
            (self.records_rejected, segment.rejects_count),
            (self.records_skipped, segment.skipped_count),
        ):
            if not total:
                continue
            known = 0
            for reason, count in segment.parse_errors:
                counter.labels(self.source, reason).inc(count)
                known += count
            if total > known:
                counter.labels(self.source, UNKNOWN_REASON).inc(total - known)

    def kafka_statistics(self, client: str) -> Callable[[str], None]:
        """librdkafka's ``stats_cb`` for ``client``: its received message bytes as a gauge."""

        def received(stats_json: str) -> None:
            try:
                stats = json.loads(stats_json)
                self.kafka_client_received_bytes.labels(self.source, client).set(float(stats["rxmsg_bytes"]))
            except (ValueError, KeyError, TypeError):
                return

        return received

    def forget_partition(self, tp: TopicPartition) -> None:
        """Drop the series of a partition this worker no longer owns (its new owner reports it)."""
        for gauge in (self.partition_next_offset, self.partition_lag_records, self.partition_lag_seconds):
            with contextlib.suppress(KeyError):
                gauge.remove(self.source, tp.topic, str(tp.partition))
