"""The table committer's settings and metrics, without servers."""

from __future__ import annotations

import pytest

from ingest.table.config import CommitSettings, PartitionBy
from ingest.table.metrics import TableMetrics
from ingest_common.errors import ConfigError
from metastore.tables import TableKind


def test_batch_settings_are_bounded_with_one_line_naming_the_option() -> None:
    assert CommitSettings(batch_segments=1, interval_s=0).batch_segments == 1
    for bad in (0, 1001):
        with pytest.raises(ConfigError, match="--batch-segments"):
            CommitSettings(batch_segments=bad)
    with pytest.raises(ConfigError, match="--interval"):
        CommitSettings(interval_s=float("nan"))


def test_partition_transforms_are_the_cli_choices() -> None:
    from ingest.cli.parser import build_parser

    args = build_parser().parse_args(["table-enable", "clicks", "--partition-by", "day", "--rejects", "none"])
    assert PartitionBy(args.partition_by) is PartitionBy.DAY
    with pytest.raises(SystemExit):
        build_parser().parse_args(["table-enable", "clicks", "--partition-by", "week"])


def test_every_counter_is_exported_at_zero_for_each_table_from_the_start() -> None:
    metrics = TableMetrics("clicks")
    samples = {
        (s.name, s.labels.get("table")): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    for name in ("ingest_table_commits_total", "ingest_table_commit_conflicts_total"):
        for kind in TableKind:
            assert samples[(name, kind.value)] == 0
