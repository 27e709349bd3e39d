"""``ingest status`` for people: the status document (``ingest.ops.status.source_status``, which
``--json`` prints as it is) as a summary line, aligned tables and one line per problem."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Columns as wide as their widest cell (pod names are long); ``right``: the indexes of
    right-aligned (numeric) columns. The last column is not padded."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def when(iso: str | None, now: datetime | None = None) -> str:
    """``2026-11-25 04:53:28 (3m ago)`` from an ISO timestamp; ``-`` for none."""
    if iso is None:
        return "-"
    at = datetime.fromisoformat(iso)
    now = now or datetime.now(UTC)
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} ({ago((now - at).total_seconds())})"


def ago(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    s = int(seconds)
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s ago"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m ago"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h ago"


def dash(value: object) -> str:
    return "-" if value is None else str(value)


def _counts(counts: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) if counts else "none"


def render(status: dict[str, Any], now: datetime | None = None) -> list[str]:
    lag = status["total_lag"] if status["kafka_reachable"] else "? (Kafka unreachable)"
    lines = [
        f"source {status['source']}: {status['state']} ({status['detailed_state']}), "
        f"spec version {status['spec_version']}, total lag {lag}, "
        f"publish conflicts: {_counts(status['publish_conflicts'])}, live workers {len(status['workers'])}",
        "",
    ]
    partitions = [
        [
            p["topic"],
            str(p["partition"]),
            p["state"],
            dash(p["earliest_offset"]),
            dash(p["next_offset"]) if p["next_offset"] is not None else f"({p['initial_position']})",
            dash(p["high_watermark"]),
            dash(p["lag"]),
            str(p["serial"]),
            dash(p["owner"]),
            when(p["last_publish_at"], now),
            when(p["last_event_time"], now),
        ]
        for p in status["partitions"]
    ]
    lines += table(
        [
            "topic",
            "part",
            "state",
            "earliest",
            "next_offset",
            "high_wm",
            "lag",
            "serial",
            "owner",
            "last_publish",
            "last_event",
        ],
        partitions,
        right=frozenset({1, 3, 4, 5, 6, 7}),
    )
    if status["workers"]:
        workers = [
            [
                w["worker"],
                w["host"],
                str(w["pid"]),
                w["state"],
                str(len(w["partitions"])),
                dash(w.get("spec_version")),
                when(w["started_at"], now),
                when(w["heartbeat_at"], now),
            ]
            for w in status["workers"]
        ]
        lines += [
            "",
            *table(
                ["worker", "host", "pid", "state", "partitions", "spec", "started", "heartbeat"],
                workers,
                right=frozenset({2, 4, 5}),
            ),
        ]
    problems = []
    for p in status["partitions"]:
        if p["state"] == "STUCK":
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: STUCK, lag {p['lag']} and no publish since "
                f"{when(p['last_publish_at'], now) if p['last_publish_at'] else 'its owner started'}"
            )
        if p.get("registry_error") is not None:
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: WAITING_FOR_SCHEMA_REGISTRY on {p['owner']}: paused,"
                " nothing rejected or skipped; it resumes by itself once the registry answers."
                f" Last error: {p['registry_error']}"
            )
        if p["lost_range"] is not None:
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: OFFSET_OUT_OF_RANGE, offsets "
                f"[{p['lost_range'][0]}, {p['lost_range'][1]}) are no longer in the log; stopped"
            )
        if p.get("truncated_range") is not None:
            lo, hi = p["truncated_range"]
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: LOG_TRUNCATED, the log was truncated below next offset"
                f" {hi}: offsets [{lo}, {hi}) were published from records no longer in the log (an unclean leader"
                " election or a lost broker log); stopped, nothing skipped; `ingest reset` resumes it"
            )
        if (recreated := p.get("topic_recreated")) is not None:
            lo, hi = recreated["range"]
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: TOPIC_RECREATED, the topic was deleted and re-created:"
                f" Kafka's topic id is {recreated['new_topic_id']}, next offset {hi} was read from topic id"
                f" {recreated['old_topic_id']}; the new log's offsets [{lo}, {hi}) hold records never read;"
                " stopped, nothing skipped; `ingest reset` resumes it in the new topic"
            )
        if p["past_log_end"] and p.get("topic_recreated") is None:
            problems.append(
                f"partition {p['topic']}[{p['partition']}]: OFFSET_OUT_OF_RANGE, next offset {p['next_offset']} is"
                f" past the log end {p['high_watermark']} (an unclean leader election or a re-created topic);"
                " stopped, nothing skipped; `ingest reset` resumes it"
            )
    problems += [gap_line(g) for g in status["offset_gaps"] if g["acknowledged_at"] is None]
    problems += [
        f"{r['table']} table: segment {r['segment_id']} REFUSED since {when(r['first_at'], now)}, "
        f"{r['attempts']} attempt(s): {r['error']}; it stays pending (the table lacks its records), "
        "the committer appends the segments after it and retries it"
        for r in status.get("table_refused_segments", [])
    ]
    problems += [
        f"error {when(e['at'], now)} {e['worker']} {e['kind']}: {e['message']}" for e in status["recent_errors"]
    ]
    for r in status.get("recent_resets", []):
        moves = ", ".join(
            f"{p['topic']}[{p['partition']}] {dash(p['old_offset'])}->{p['new_offset']}" for p in r["partitions"]
        )
        problems.append(
            f"reset #{r['id']} {when(r['at'], now)} by {r['actor']} to {r['target']}: {moves}"
            + (f" ({r['reason']})" if r["reason"] else "")
        )
    return lines + (["", *problems] if problems else [])


def gap_line(g: dict[str, Any]) -> str:
    action = f"skipped at {g['skipped_at']}" if g["skipped"] else "partition stopped there"
    ack = (
        f"acknowledged by {g['acknowledged_by']} at {g['acknowledged_at']}"
        if g["acknowledged_at"]
        else "unacknowledged"
    )
    epoch = f" epoch {g['epoch']}" if g.get("epoch") else ""
    return (
        f"gap {g['id']}: {g['topic']}[{g['partition']}]{epoch} [{g['from_offset']}, {g['to_offset']}) "
        f"{g['lost_records']} record(s) lost{_gap_reason(g)},"
        f" detected {g['detected_at']}, {action}, {ack}"
    )


def _gap_reason(g: dict[str, Any]) -> str:
    if g.get("reason") == "log_truncated":
        return " (log truncated)"
    if g.get("reason") == "topic_recreated":
        return f" (topic re-created: id {g.get('old_topic_id')} -> {g.get('new_topic_id')})"
    return ""
