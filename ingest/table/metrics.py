"""The table committer's metrics (``ingest table-commit`` serves them on INGEST_METRICS_PORT).

Every series carries ``source`` and ``table`` (``data`` or ``rejects``); counters exist at 0
from the start so that increase() sees the first conflict.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from metastore.tables import TableKind

_COMMIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class TableMetrics:
    def __init__(self, source: str, kinds: tuple[TableKind, ...] = tuple(TableKind)) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.source = source
        labels = ["source", "table"]
        self.commit_seconds = Histogram(
            "ingest_table_commit_seconds",
            "One Iceberg commit: schema check, add_files, catalog swap and the metastore record",
            labels,
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.commits = Counter("ingest_table_commits", "Iceberg commits made", labels, registry=r)
        self.segments_committed = Counter(
            "ingest_table_segments_committed", "Published segments appended to the table", labels, registry=r
        )
        self.replacements = Counter(
            "ingest_table_replacements",
            "Segment replacements (compaction) committed as one overwrite snapshot each",
            labels,
            registry=r,
        )
        self.commit_conflicts = Counter(
            "ingest_table_commit_conflicts",
            "Iceberg commits refused by the catalog because the table changed meanwhile (retried)",
            labels,
            registry=r,
        )
        self.segments_behind = Gauge(
            "ingest_table_segments_behind", "Published segments the table does not hold yet", labels, registry=r
        )
        self.lag_seconds = Gauge(
            "ingest_table_lag_seconds",
            "Age of the oldest published segment the table does not hold yet (0: none)",
            labels,
            registry=r,
        )
        self.segments_refused = Gauge(
            "ingest_table_segments_refused",
            "Published segments the table could not take because of their files (kept pending, retried)",
            labels,
            registry=r,
        )
        self.committer_active = Gauge(
            "ingest_table_committer_active",
            "1 while this process holds the source's committer lock (one committer per source)",
            ["source"],
            registry=r,
        )
        self.cross_partition_keys = Gauge(
            "ingest_table_cross_partition_keys",
            "Upsert tables: keys seen on more than one partition so far (their order is undefined)",
            ["source"],
            registry=r,
        )
        for kind in kinds:
            for counter in (self.commits, self.segments_committed, self.replacements, self.commit_conflicts):
                counter.labels(source, kind.value)
            self.segments_refused.labels(source, kind.value).set(0)
        self.committer_active.labels(source).set(0)
