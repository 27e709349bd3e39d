"""Property-based tests of the parsing path (hostile input) against real Spark, the records
read from a real Kafka topic (each example's records produced once, to a topic the module's
examples share).

Each generated record has a known expected classification; the build must put every
record in exactly one place (a good row or a reject with that reason) and never lose one.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ingest.spec.parse import spec_from_dict
from ingest_common.model import TopicPartition
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import MakeTopic
from tests.kafka_splits import produce, spark_builder, split_over, values

GOOD_TS = st.sampled_from(
    [
        "2026-11-22T10:00:00Z",
        "1970-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
        "2026-11-22T10:00:00.123456+05:30",
    ]
)
# Valid timestamps whose instant lies outside years 1-9999 in UTC.
FAR_TS = st.sampled_from(["9999-12-31T23:30:00-05:00", "0001-01-01T00:00:00+05:30"])
WRONG = {
    "id": st.sampled_from(["abc", [1], {"x": 1}, 1.5]),
    "ok": st.sampled_from(["maybe", [True], {"b": 1}]),
    "tags": st.sampled_from(["notarray", 5, {"k": "v"}]),
    "ts": st.sampled_from(["garbage", "2026-13-45T99:00:00Z", [1]]),
}
text = st.text(max_size=40)


@st.composite
def good_object(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {"ts": draw(GOOD_TS)}
    if draw(st.booleans()):
        obj["id"] = draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))
    if draw(st.booleans()):
        obj["ok"] = draw(st.one_of(st.none(), st.booleans()))
    if draw(st.booleans()):
        obj["tags"] = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), text), max_size=5)))
    if draw(st.booleans()):
        obj["note"] = draw(st.one_of(st.none(), text, st.text(min_size=5000, max_size=20000)))
    if draw(st.booleans()):  # unknown and deeply nested fields are ignored
        nested: Any = draw(text)
        for _ in range(draw(st.integers(1, 60))):
            nested = {"n": nested}
        obj["extra"] = nested
    return obj


@st.composite
def record(draw: st.DrawFn) -> tuple[bytes | None, str | None]:
    """A Kafka value and the expected error (None: a good row)."""
    kind = draw(
        st.sampled_from(["good", "good", "good", "wrong", "no_ts", "null", "utf8", "truncated", "bytes", "far"])
    )
    if kind == "null":
        return None, "null_value"
    obj = draw(good_object())
    if kind == "good":
        return json.dumps(obj).encode(), None
    if kind == "wrong":
        field = draw(st.sampled_from(sorted(WRONG)))
        obj[field] = draw(WRONG[field])
        return json.dumps(obj).encode(), "type_mismatch"
    if kind == "far":
        obj["ts"] = draw(FAR_TS)
        return json.dumps(obj).encode(), "event_time_out_of_range"
    if kind == "no_ts":
        obj.pop("ts")
        return json.dumps(obj).encode(), "missing_event_time"
    if kind == "utf8":
        raw = json.dumps(obj).encode()
        cut = draw(st.integers(0, len(raw)))
        return raw[:cut] + b"\xff\xfe" + raw[cut:], "invalid_utf8"
    if kind == "truncated":
        raw = json.dumps(obj).encode()
        return raw[: draw(st.integers(0, len(raw) - 1))], "invalid_json"
    junk = draw(st.binary(max_size=64).filter(lambda b: _not_json_object(b)))
    return junk, ("invalid_utf8" if not _utf8(junk) else "invalid_json")


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _not_json_object(b: bytes) -> bool:
    try:
        return not isinstance(json.loads(b), dict)
    except ValueError:
        return True


@pytest.fixture(scope="module")
def partition(make_module_topic: MakeTopic) -> TopicPartition:
    """Every example appends its records to it."""
    return TopicPartition(make_module_topic(partitions=1, prefix="parse"), 0)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(st.lists(record(), min_size=1, max_size=40))
# Blank input and a JSON `null` parse to a null struct, not a corrupt record.
@example(records=[(b"", "invalid_json"), (b"null", "invalid_json"), (b"  ", "invalid_json"), (b"[]", "invalid_json")])
@example(
    records=[
        (b'{"ts": "9999-12-31T23:30:00-05:00"}', "event_time_out_of_range"),
        (b'{"ts": "0001-01-01T00:00:00+05:30"}', "event_time_out_of_range"),
        (b'{"ts": "9999-12-31T23:59:59Z"}', None),
        # The parse's reason wins over the event time's (from_json keeps the fields it could parse).
        (b'{"ts": "9999-12-31T23:30:00-05:00", "id": "x"}', "type_mismatch"),
    ]
)
def test_every_record_is_a_row_or_a_reject_with_the_right_reason(
    spark: Any,
    kafka_bootstrap: str,
    partition: TopicPartition,
    tmp_path: Path,
    records: list[tuple[bytes | None, str | None]],
) -> None:
    spec = spec_from_dict(
        {
            "name": "p",
            "topics": ["t"],
            "event_time": "ts",
            "segment_store": str(tmp_path / uuid.uuid4().hex),
            "schema": {"id": "long", "ok": "boolean", "ts": "timestamp", "tags": "array<string>", "note": "string"},
        }
    )
    offsets = produce(kafka_bootstrap, partition, values([value for value, _ in records]))
    built = spark_builder(spark, kafka_bootstrap, RecordingRegistrar()).build(split_over(offsets), spec)
    assert built.row_count + built.rejects_count == len(records) and built.skipped_count == 0
    at = offsets.start
    good = [at + i for i, (_, t) in enumerate(records) if t is None]
    rows = pq.read_table([f.removeprefix("file://") for f in built.files]).to_pylist() if built.files else []
    assert sorted(r["_offset"] for r in rows) == good
    rejects = (
        pq.read_table([f.removeprefix("file://") for f in built.rejects_files]).to_pylist()
        if built.rejects_files
        else []
    )
    assert {r["_offset"]: r["_error"] for r in rejects} == {
        at + i: t for i, (_, t) in enumerate(records) if t is not None
    }
    # The per-reason counts (the reason label of ingest_records_rejected_total) match the rejects file.
    assert dict(built.parse_errors) == Counter(r["_error"] for r in rejects)
    for r in rejects:  # the raw bytes are kept exactly
        assert r["_value"] == records[r["_offset"] - at][0]
