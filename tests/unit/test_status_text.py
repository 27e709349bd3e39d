"""``ingest status`` as text: aligned columns whatever the content, every partition's state,
earliest offset and last event time, readable times, no Python syntax."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ingest.ops.status_text import ago, render, table, when

NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
LONG_POD = "ingest-worker-7d9f8c6b5-x2k4q.ingest-workers.data-platform.svc.cluster.local-12345-abcdef"


def partition(n: int, **over: Any) -> dict[str, Any]:
    p = {
        "topic": "clicks",
        "partition": n,
        "state": "OK",
        "lost_range": None,
        "past_log_end": False,
        "next_offset": 1200 * n,
        "earliest_offset": 0,
        "high_watermark": 1250 * n,
        "lag": 50 * n,
        "owner": LONG_POD if n == 1 else "w-short",
        "serial": 3,
        "last_publish_at": "2026-11-25T11:59:30+00:00",
        "last_event_time": "2026-11-25T11:58:00+00:00",
        "initial_position": "earliest",
    }
    p.update(over)
    return p


def status(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "source": "clicks",
        "state": "RUNNING",
        "detailed_state": "CATCHING_UP",
        "spec_version": 2,
        "kafka_reachable": True,
        "total_lag": 150,
        "publish_conflicts": {"serial": 2, "abandoned": 1},
        "workers": [
            {
                "worker": LONG_POD,
                "host": "node-1",
                "pid": 7,
                "state": "running",
                "partitions": [1, 2],
                "started_at": "2026-11-25T10:00:00+00:00",
                "heartbeat_at": "2026-11-25T11:59:58+00:00",
                "spec_version": 2,
            }
        ],
        "partitions": [
            partition(0),
            partition(1),
            partition(2, state="OFFSET_OUT_OF_RANGE", lost_range=[10, 20], next_offset=None, last_event_time=None),
        ],
        "offset_gaps": [],
        "recent_errors": [],
        "recent_resets": [],
    }
    s.update(over)
    return s


def test_columns_line_up_however_long_the_owner_is() -> None:
    lines = render(status(), NOW)
    header = next(i for i, line in enumerate(lines) if line.startswith("topic"))
    rows = lines[header : header + 4]
    # Every column starts at the same index in every row (the header's column starts).
    starts = [i for i in range(1, len(rows[0])) if rows[0][i] != " " and rows[0][i - 1] == " "]
    for row in rows[1:]:
        for start in starts:
            assert row[start - 1] == " ", (start, rows)
    assert LONG_POD in rows[2]


def test_every_partition_shows_its_state_earliest_offset_and_last_event_time() -> None:
    text = "\n".join(render(status(), NOW))
    for column in ("state", "earliest", "last_event"):
        assert column in text
    assert "OFFSET_OUT_OF_RANGE" in text and "(earliest)" in text  # no stored offset yet: the start position
    assert "2026-11-25 11:58:00 (2m00s ago)" in text
    assert "offsets [10, 20) are no longer in the log" in text


def test_a_partition_stored_past_the_log_end_gets_a_problem_line() -> None:
    past = partition(0, state="OFFSET_OUT_OF_RANGE", next_offset=50, high_watermark=10, lag=0, past_log_end=True)
    text = "\n".join(render(status(partitions=[past]), NOW))
    assert "partition clicks[0]: OFFSET_OUT_OF_RANGE, next offset 50 is past the log end 10" in text


def test_a_partition_waiting_for_the_schema_registry_gets_a_problem_line_with_the_error() -> None:
    error = "schema registry http://registry:8081 did not answer for schema id 7: Connection refused"
    waiting = partition(0, state="WAITING_FOR_SCHEMA_REGISTRY", registry_error=error)
    lines = render(status(partitions=[waiting, partition(1, registry_error=None)]), NOW)
    problems = [line for line in lines if "WAITING_FOR_SCHEMA_REGISTRY on" in line]
    assert problems == [
        "partition clicks[0]: WAITING_FOR_SCHEMA_REGISTRY on w-short: paused, nothing rejected or skipped; it"
        f" resumes by itself once the registry answers. Last error: {error}"
    ]


def test_no_python_syntax_in_the_summary() -> None:
    summary = render(status(), NOW)[0]
    assert "publish conflicts: abandoned 1, serial 2" in summary
    assert "{" not in summary and "'" not in summary
    assert "publish conflicts: none" in render(status(publish_conflicts={}), NOW)[0]


def test_readable_times() -> None:
    assert when(None) == "-"
    assert when("2026-11-25T11:59:58+00:00", NOW) == "2026-11-25 11:59:58 (2s ago)"
    assert [ago(s) for s in (5, 125, 7260, 90000)] == ["5s ago", "2m05s ago", "2h01m ago", "1d01h ago"]


def test_table_widths_come_from_the_content() -> None:
    assert table(["a", "num"], [["long-value", "1"], ["x", "12345"]], right=frozenset({1})) == [
        "a             num",
        "long-value      1",
        "x           12345",
    ]
