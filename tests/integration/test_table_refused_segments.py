"""A segment the table cannot take (ingest.table.refusals), against a real PostgreSQL (the
metastore and its catalog): a string that is not UTF-8 and a timestamp past year 9999 in
segments' files (written before the builder made such values rejects) make pyiceberg refuse
the files. The running committer does not stop: it sets each such segment aside, appends every
other segment, keeps the refused ones pending and says so (``ingest status``, ``ingest table``,
``ingest audit``, its /healthz and /readyz, a metric), retries them on its backoff, and appends
one as soon as it can be taken; ``table-commit --once`` exits 1 naming them."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.config import Settings
from ingest.ops.status import source_status
from ingest.ops.status_text import render
from ingest.segments.store import filesystem
from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.runner import run_committer
from ingest.table.status import table_status
from ingest_common.backoff import Backoff
from metastore.tables import TableKind, TableStore
from tests.integration.iceberg_harness import (
    Source,
    assert_eventually,
    audit_findings,
    gauge,
    run_cli,
    table_offsets,
)

# 10000-01-01T00:00:00Z in microseconds: one past what Iceberg's statistics (Python datetimes) hold.
YEAR_10000_US = 253_402_300_800_000_000


@pytest.fixture
def src(database_url: str, tmp_path: Path) -> Iterator[Source]:
    source = Source(database_url, f"file://{tmp_path}/store")
    yield source
    source.store.close()


def poison(src: Source, segment_id: int, column: str, value: pa.Array) -> None:
    """Rewrite the segment's data file with ``value`` (one row's worth) as its first row's ``column``."""
    [segment] = [s for s in src.store.segments(src.name) if s["id"] == segment_id]
    [uri] = segment["files"]
    fs, path = filesystem(uri)
    table = pq.read_table(path, filesystem=fs)
    i = table.schema.get_field_index(column)
    rest = table.column(column).combine_chunks()[1:]
    table = table.set_column(i, table.schema.field(i), pa.concat_arrays([value, rest]))
    pq.write_table(table, path, filesystem=fs, compression="zstd")


def not_utf8() -> pa.Array:
    # A view skips the UTF-8 check pyarrow makes of Python strings: the bytes Spark can write.
    return pa.array([b"bad \xff\xfe"], pa.binary()).view(pa.string())


def year_10000() -> pa.Array:
    return pa.array([YEAR_10000_US], pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def offsets_of(src: Source, *segment_ids: int) -> list[int]:
    out = []
    for s in src.store.segments(src.name):
        if s["id"] in segment_ids:
            out += [o for r in s["ranges"] for o in range(r["start"], r["end"])]
    return out


def test_a_segment_the_table_cannot_take_is_set_aside_reported_and_retried_while_the_rest_goes_in(
    database_url: str, src: Source
) -> None:
    first = src.publish(4)
    bad_text = src.publish(3)
    middle = src.publish(2)
    bad_time = src.publish(3)
    last = src.publish(5)
    poison(src, bad_text, "user", not_utf8())
    poison(src, bad_time, "ts", year_10000())
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    settings = CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1, refused_retry=Backoff(0.2, 0.5))
    stop = threading.Event()
    with TableCommitter(database_url, src.name, settings) as c:
        runner = threading.Thread(target=run_committer, args=(c, stop))
        runner.start()
        try:
            good = sorted(offsets_of(src, first, middle, last))
            # The five went out as one batch, which the table refused: it was halved until each bad
            # segment stood alone, and everything else went in. The committer is still running.
            assert_eventually(lambda: table_offsets(database_url, src.name) == good, runner)

            def refused() -> dict[int, int]:
                with TableStore(database_url) as store:
                    return {r["segment_id"]: r["attempts"] for r in store.refusals(src.name)}

            # Retried on its backoff, alone, and refused again each time.
            assert_eventually(lambda: set(refused()) == {bad_text, bad_time} and min(refused().values()) >= 2, runner)
            with TableStore(database_url) as store:
                assert store.behind(src.name, TableKind.DATA)[0] == 2  # pending, not skipped
                errors = {r["segment_id"]: r["error"] for r in store.refusals(src.name)}
            assert "utf-8" in errors[bad_text] and "\n" not in errors[bad_text]
            assert "out of range" in errors[bad_time]
            # The committer's probes: alive (a restart would not help), not ready, both say why.
            healthy, why = c.health.healthy()
            ready, _ = c.health.ready()
            assert healthy and not ready and named(why) == [bad_text, bad_time], why
            assert gauge(c.metrics, "ingest_table_segments_refused", source=src.name, table="data") == 2
            # ingest status, ingest table, ingest audit.
            status = source_status(src.store, Settings(database_url=database_url, kafka_bootstrap=""), src.name)
            assert [r["segment_id"] for r in status["table_refused_segments"]] == [bad_text, bad_time]
            assert any(f"segment {bad_text} REFUSED" in line for line in render(status))
            [data] = table_status(database_url, src.name)["tables"]
            assert [r["segment_id"] for r in data["refused_segments"]] == [bad_text, bad_time]
            found = [line for line in audit_findings(database_url, src.name) if line.startswith("table_refused")]
            assert len(found) == 2 and f"segment {bad_text}:" in found[0], found

            # New segments keep going in past the refused ones.
            later = src.publish(6)
            assert_eventually(lambda: later in set(_held(database_url, src.name)), runner)
            # A segment the table can take now (here: its file repaired; in life, a committer that
            # reads it) goes in at its next retry, and its refusal is gone with its record.
            poison(src, bad_text, "user", pa.array(["fine"], pa.string()))
            assert_eventually(lambda: set(refused()) == {bad_time}, runner)
            assert runner.is_alive()
            healthy, why = c.health.healthy()
            assert healthy and named(why) == [bad_time], why
        finally:
            stop.set()
            runner.join(timeout=60)
    held = table_offsets(database_url, src.name)
    assert not [o for o, n in Counter(held).items() if n > 1]
    assert held == sorted(set(src.published_offsets()) - set(offsets_of(src, bad_time)))

    # --once: commits nothing more, names the refused segment, exits 1.
    once = run_cli(database_url, "table-commit", src.name, "--once", "--json")
    out, _ = once.communicate(timeout=120)
    assert once.returncode == 1, out
    # Its log lines (stderr, one JSON object each) come with it: the document is the indented one.
    lines = out.splitlines()
    doc = json.loads("\n".join(lines[lines.index("{") : lines.index("}") + 1]))
    assert doc["commits"] == [] and [r["segment_id"] for r in doc["refused"]] == [bad_time]


def named(reason: str) -> list[int]:
    """The segments a probe's reason names as refused."""
    return [int(i) for i in re.findall(r"a file of segment (\d+) cannot be added", reason)]


def _held(database_url: str, source: str) -> list[int]:
    with TableStore(database_url) as store:
        return [int(r["segment_id"]) for r in store.held(source)]
