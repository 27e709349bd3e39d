"""A valid JSON value is a row whatever the length of its strings (Jackson's default cap of
20,000,000 characters would make it a ``type_mismatch``), through the plan's own expressions
on a real Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ingest.builder.plan import READ_DDL, make_plan
from ingest.spec.parse import spec_from_dict


def test_a_string_longer_than_jacksons_default_cap_is_read(spark: Any, tmp_path: Path) -> None:
    spec = spec_from_dict(
        {
            "name": "big",
            "topics": ["big"],
            "event_time": "ts",
            "segment_store": str(tmp_path),
            "schema": {"ts": "timestamp", "body": "string"},
        }
    )
    body = "x" * 20_000_001
    value = json.dumps({"ts": "2026-12-07T10:00:00Z", "body": body}).encode()
    rows = [("big", 0, 0, datetime(2026, 12, 7, tzinfo=UTC), None, value, 0)]
    plan = make_plan(spec)
    df = spark.createDataFrame(rows, READ_DDL).select(*plan.read_columns).withColumn("_error", plan.error)
    [row] = df.select("_error", *plan.output_columns).collect()
    assert row["_error"] is None
    assert len(row["body"]) == len(body)
