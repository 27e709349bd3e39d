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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_committer_health_fails_after_the_bound_of_failing_passes_or_of_silence_and_tells_standby_from_active() -> None:
    from ingest.roles.health import RoleHealth
    from ingest.table.role import NAMES

    clock = Clock()
    health = RoleHealth(NAMES, "clicks", unhealthy_after_s=60, idle_s=10, pass_deadline_s=120, clock=clock)
    assert health.healthy() == (True, "starting") and health.ready() == (False, "starting")
    health.active()
    health.passed()
    assert health.healthy() == (True, "active") and health.ready() == (True, "active")
    # Failing passes: alive (retrying) within the bound, not ready; unhealthy past it.
    health.failed("connection refused")
    clock.now += 30
    health.failed("connection refused")
    ok, reason = health.healthy()
    assert ok and reason.startswith("active, retrying: 2 pass(es) failed in a row")
    assert health.ready()[0] is False
    clock.now += 31
    assert health.healthy() == (False, "2 pass(es) failed in a row over 61 s; last: connection refused")
    health.standby()
    health.passed()
    assert health.healthy() == (True, "standby")
    assert health.ready() == (False, "standby: another committer holds the lock of source 'clicks'")
    # No pass or attempt ending for longer than the bound plus the longest wait: hung.
    clock.now += 69
    assert health.healthy() == (True, "standby")
    health.progressed()
    clock.now += 71
    assert health.healthy() == (False, "standby: no pass or commit attempt ended for 71 s")
    health.stopped("table ingest.clicks holds commit 3 but the metastore recorded 1")
    assert health.healthy() == (False, "stopped: table ingest.clicks holds commit 3 but the metastore recorded 1")
    with pytest.raises(ConfigError, match="unhealthy_after_s"):
        CommitSettings(unhealthy_after_s=0)
    with pytest.raises(ConfigError, match="INGEST_TABLE_PASS_DEADLINE_S"):
        CommitSettings(pass_deadline_s=0)
