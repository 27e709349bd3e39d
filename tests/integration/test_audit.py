"""``ingest audit`` against a real PostgreSQL and real stores (a local directory, an S3 API):
epochs after resets, skipped gaps and pinned starts tile; holes, overlaps and missing objects
are findings. Segments are published as a worker publishes them
(tests.integration.iceberg_harness.Source); tests/acceptance/test_audit.py audits what real
workers built."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.cli import main
from ingest.segments.store import filesystem
from ingest_common.model import TopicPartition
from metastore import Metastore
from tests.fixtures.servers import S3Server
from tests.integration.iceberg_harness import T0, Source

T1 = TopicPartition(T0.topic, 1)
T2 = TopicPartition(T0.topic, 2)


def audit(
    database_url: str, source: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, dict[str, Any]]:
    """``ingest audit SOURCE [flags] --json`` in this process: its exit code and document."""
    monkeypatch.setenv("INGEST_DATABASE_URL", database_url)
    capsys.readouterr()
    code = main(["audit", source, *flags, "--json"])
    out, err = capsys.readouterr()
    assert out, err
    return code, json.loads(out)


def lines(document: dict[str, Any]) -> list[str]:
    return [f["line"] for f in document["findings"]]


def reclaim(src: Source, tp: TopicPartition, offset: int) -> None:
    """After a reset: claim the partition again (a new serial) and publish from ``offset``."""
    claims = src.store.claim_partitions(src.name, "w", [tp])
    src.serials[tp] = claims[tp].serial
    assert claims[tp].next_offset == offset
    src.next[tp] = offset


def sql(database_url: str, statement: str, *params: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(statement, params)


def test_epochs_gaps_and_pinned_starts_tile_and_a_hole_in_one_epoch_is_found(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = Source(database_url, f"file://{tmp_path}/store", partitions=2)
    src.publish(10)
    src.publish(5, rejects=2)
    # Retention took [17, 20) before it was read: a skipped gap of epoch 0.
    src.store.skip_gap(src.name, "w", T0, src.serials[T0], 17, 20)
    src.next[T0] = 20
    holed = src.publish(3, holes=1)
    # Replay [10, 24) in epoch 1; skip [6, 50) of partition 1 in its epoch 1.
    src.publish(6, partition=1)
    for tp, offset in ((T0, 10), (T1, 50)):
        src.store.reset_offsets(src.name, {tp: offset}, actor="t", reason="", target=str(offset), confirmed=True)
        reclaim(src, tp, offset)
    replayed = src.publish(4)
    # A gap skipped after the reset belongs to epoch 1 (its partition's), not to epoch 0.
    src.store.skip_gap(src.name, "w", T0, src.serials[T0], 14, 16)
    src.next[T0] = 16
    src.publish(2, partition=1)
    # A partition pinned at 100 (start_from latest): its epoch 0 starts there.
    claims = src.store.claim_from(src.name, "w", [T2], start=100)
    src.serials[T2], src.next[T2] = claims[T2].serial, 100
    src.publish(5, partition=2)

    code, doc = audit(database_url, src.name, monkeypatch, capsys, "--files")
    assert (code, lines(doc)) == (0, [])
    assert doc["ok"] and doc["partitions"] == 3 and doc["segments"] == 7 and doc["files_read"] == 8
    assert (doc["holes"], doc["holes_unrecorded"]) == (1, 0)
    with Metastore(database_url) as store:
        rows = {(r["topic"], r["partition"]): r for r in store.audit_partitions(src.name)}
        assert [rows[(tp.topic, tp.partition)]["start_offset"] for tp in (T0, T1, T2)] == [0, 0, 100]
        last = store.last_audit(src.name)
        assert last is not None and last["findings"] == 0 and last["files"]

    # The replay's segment gone: a hole in epoch 1 only (epoch 0 still holds [10, 14)).
    sql(database_url, "DELETE FROM ingest_segment_ranges WHERE segment_id = %s", replayed)
    sql(database_url, "DELETE FROM ingest_segments WHERE id = %s", replayed)
    # Partition 2's recorded start moved before its first range: a hole there too.
    sql(database_url, "UPDATE ingest_partitions SET start_offset = 90 WHERE source = %s AND partition = 2", src.name)
    # A segment whose holes and records do not make up its range; one with no holes recorded
    # (an earlier release's) is counted apart, not a finding.
    sql(database_url, "UPDATE ingest_segments SET holes = 2 WHERE id = %s", holed)
    sql(database_url, "UPDATE ingest_segments SET holes = NULL WHERE source = %s AND holes = 0", src.name)
    code, doc = audit(database_url, src.name, monkeypatch, capsys)
    assert code == 1
    assert lines(doc) == [
        "hole: events[0] epoch 1: offsets [10, 14) are in no segment and no skipped gap",
        "hole: events[2] epoch 0: offsets [90, 100) are in no segment and no skipped gap",
        f"records: segment {holed}: 3 row(s) + 0 reject(s) + 0 skipped + 2 hole(s) = 5 offset(s) in ranges covering 4",
    ]
    assert (doc["holes"], doc["holes_unrecorded"]) == (2, 5)
    with Metastore(database_url) as store:
        last = store.last_audit(src.name)
        assert last is not None and last["findings"] == 3 and last["by_kind"] == {"hole": 2, "records": 1}
        exported = store.control(src.name).last_audit  # what workers export with their heartbeat
        assert exported is not None and (exported.findings, exported.finished_at) == (3, last["finished_at"])
    src.store.close()


def test_gaps_skipped_at_the_same_offset_in_two_epochs_each_tile_their_own(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Retention took [10, 20) in epoch 0; a reset replays from 0 and, in epoch 1, finds
    [10, 22) gone: two ledger rows, each in its epoch's tiling."""
    src = Source(database_url, f"file://{tmp_path}/store")
    src.publish(10)
    src.store.skip_gap(src.name, "w", T0, src.serials[T0], 10, 20)
    src.next[T0] = 20
    src.publish(5)
    src.store.reset_offsets(src.name, {T0: 0}, actor="t", reason="replay", target="0", confirmed=True)
    reclaim(src, T0, 0)
    src.publish(10)
    src.store.skip_gap(src.name, "w", T0, src.serials[T0], 10, 22)
    src.next[T0] = 22
    src.publish(3)
    assert [(g["epoch"], g["from_offset"], g["to_offset"]) for g in src.store.gaps(src.name)] == [
        (0, 10, 20),
        (1, 10, 22),
    ]
    code, doc = audit(database_url, src.name, monkeypatch, capsys)
    assert (code, lines(doc)) == (0, [])
    src.store.close()


def test_overlaps_and_strays_are_found(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = Source(database_url, f"file://{tmp_path}/store")
    first, second, third = src.publish(10), src.publish(10), src.publish(10)
    assert audit(database_url, src.name, monkeypatch, capsys)[0] == 0
    sql(database_url, "UPDATE ingest_segment_ranges SET start_offset = 15 WHERE segment_id = %s", third)
    sql(database_url, "UPDATE ingest_segment_ranges SET end_offset = 35 WHERE segment_id = %s", third)
    sql(database_url, "UPDATE ingest_segment_ranges SET epoch = 3 WHERE segment_id = %s", first)
    sql(database_url, "UPDATE ingest_segments SET row_count = 30 WHERE id = %s", second)
    code, doc = audit(database_url, src.name, monkeypatch, capsys)
    assert code == 1
    assert lines(doc) == [
        "hole: events[0] epoch 0: offsets [0, 10) are in no segment and no skipped gap",
        f"overlap: events[0] epoch 0: offsets [15, 20) are in segment {third} and in segment {second}",
        f"outside: events[0] epoch 0: segment {third} reaches 35, past the epoch's end 30",
        f"outside: events[0] epoch 3: segment {first} [0, 10) lies in an epoch the partition never had",
        f"records: segment {second}: 30 row(s) + 0 reject(s) + 0 skipped = 30 record(s) "
        "in ranges covering 10 offset(s)",
        # Its range stretched to 20 offsets: its 10 records and no holes no longer make it up.
        f"records: segment {third}: 10 row(s) + 0 reject(s) + 0 skipped + 0 hole(s) = 10 offset(s) "
        "in ranges covering 20",
    ]
    src.store.close()


def test_files_on_an_s3_store_are_read_and_a_missing_object_is_found(
    database_url: str,
    s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for variable, value in s3_server.env.items():
        monkeypatch.setenv(variable, value)
    src = Source(database_url, s3_server.uri(f"audit-{uuid.uuid4().hex[:8]}"))
    try:
        src.publish(6, rejects=1)
        gone = src.publish(4)
        code, doc = audit(database_url, src.name, monkeypatch, capsys, "--files")
        assert (code, lines(doc), doc["files_read"]) == (0, [], 3)
        uri = src.store.current_segments(src.name)[-1]["files"][0]
        assert uri.startswith("s3a://")
        fs, path = filesystem(uri)
        fs.delete_file(path)
        code, doc = audit(database_url, src.name, monkeypatch, capsys, "--files")
        assert code == 1
        assert lines(doc) == [f"missing_file: segment {gone} file {uri}: listed by the segment, not in the store"]
    finally:
        src.store.close()
