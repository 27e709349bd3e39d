"""The compactor role's metrics (``ingest compact SOURCE --every S`` serves them on
INGEST_METRICS_PORT, with the /healthz and /readyz of its health, ingest.roles.health, through
``ingest.ops.endpoints``).

Every series carries ``source``. The store's shape (segments, data files, bytes, the median data
file size, how old the oldest segment worth compacting is) is read from the metastore's current
segments after each pass, by the active compactor and by standbys alike: alerts take the maximum
over every compactor of a source, so none may keep a value from when it was active.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ingest.spark.session import spark_connect_events_counter
from ingest_common.model import SparkConnectEvent

if TYPE_CHECKING:
    from ingest.compact.job import CompactionResult
    from ingest.compact.plan import Chunk

_SECONDS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800)


class CompactionMetrics:
    def __init__(self, source: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["source"]
        self.source = source
        self.segments_compacted = Counter(
            "ingest_compaction_segments_compacted", "Segments replaced by compaction", labels, registry=r
        )
        self.replacements = Counter(
            "ingest_compaction_replacements", "New segments compaction wrote (one per chunk)", labels, registry=r
        )
        self.bytes_rewritten = Counter(
            "ingest_compaction_bytes_rewritten", "Bytes of the segments compaction replaced", labels, registry=r
        )
        self.refused = Counter(
            "ingest_compaction_refused", "Replacements the metastore refused", ["source", "reason"], registry=r
        )
        self.failures = Counter("ingest_compaction_pass_failures", "Compaction passes that failed", labels, registry=r)
        self.chunk_seconds = Histogram(
            "ingest_compaction_chunk_seconds",
            "One chunk: registration, the Spark job, the footers' check and the replacement",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.segments = Gauge("ingest_segments_current", "Current segments of the source", labels, registry=r)
        self.files = Gauge("ingest_segment_files", "Data files the current segments list", labels, registry=r)
        self.bytes = Gauge("ingest_segment_bytes", "Bytes of the current segments", labels, registry=r)
        self.median_file = Gauge(
            "ingest_segment_file_median_bytes",
            "Median size of the current segments' data files (each file at its segment's mean size)",
            labels,
            registry=r,
        )
        self.pending = Gauge(
            "ingest_compaction_segments_pending", "Segments a compaction pass would rewrite now", labels, registry=r
        )
        self.lag_seconds = Gauge(
            "ingest_compaction_lag_seconds",
            "Age of the oldest segment a compaction pass would rewrite now (0: none)",
            labels,
            registry=r,
        )
        self.last_pass = Gauge(
            "ingest_compaction_last_pass_timestamp_seconds",
            "When this compactor's last pass ended well (Unix time; 0: never)",
            labels,
            registry=r,
        )
        self.active = Gauge(
            "ingest_compactor_active", "1 while this process holds the source's compactor lock", labels, registry=r
        )
        # The same series as a worker's (ingest.ops.metrics): the alerts on it cover both roles.
        self.spark_connect_events = spark_connect_events_counter(r)
        for event in SparkConnectEvent:
            self.spark_connect_events.labels(source, event.value)
        for counter in (self.segments_compacted, self.replacements, self.bytes_rewritten, self.failures):
            counter.labels(source)
        for gauge in (self.last_pass, self.active):
            gauge.labels(source).set(0)

    def connect_event(self, event: SparkConnectEvent) -> None:
        self.spark_connect_events.labels(self.source, event.value).inc()

    def passed(self, result: CompactionResult) -> None:
        s = self.source
        for done in result.replaced:
            self.segments_compacted.labels(s).inc(len(done.replaced))
            self.replacements.labels(s).inc()
            self.bytes_rewritten.labels(s).inc(done.bytes_before)
            self.chunk_seconds.labels(s).observe(done.seconds)
        for _ids, reason, _detail in result.refused:
            self.refused.labels(s, reason).inc()
        self.last_pass.labels(s).set(time.time())

    def shape(self, segments: Sequence[Mapping[str, Any]], chunks: Iterable[Chunk]) -> None:
        """The store's shape from the current segments, and what is waiting to be compacted."""
        s = self.source
        sizes: list[float] = []
        for seg in segments:
            files = len(seg["files"])
            sizes += [int(seg["size_bytes"]) / files] * files if files else []
        self.segments.labels(s).set(len(segments))
        self.files.labels(s).set(len(sizes))
        self.bytes.labels(s).set(sum(int(seg["size_bytes"]) for seg in segments))
        self.median_file.labels(s).set(statistics.median(sizes) if sizes else 0)
        waiting = {c.id for chunk in chunks for c in chunk.segments}
        published = [seg["published_at"] for seg in segments if int(seg["id"]) in waiting]
        self.pending.labels(s).set(len(waiting))
        oldest = min(published, default=None)
        self.lag_seconds.labels(s).set(max(0.0, (datetime.now(UTC) - oldest).total_seconds()) if oldest else 0.0)
