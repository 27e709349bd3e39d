"""``ingest audit`` over what a real worker built (Kafka, Spark, PostgreSQL) and its Iceberg
table: the clean source passes, and each defect injected into the metastore, the store or the
table is caught with its line (exit 1), then undone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest.builder.job import BuilderFactory
from ingest.table.catalog import MetastoreCatalog, identifier
from ingest_dev.testkit import wait_until
from metastore import Metastore
from metastore.tables import TableKind
from tests.acceptance.harness import (
    NewSource,
    StartWorker,
    process_env,
    sample_value,
    settings,
)
from tests.acceptance.test_cli import ingest


def audit(env: dict[str, str], source: str, text_too: bool = False) -> tuple[int, list[str], dict[str, Any]]:
    """``ingest audit SOURCE --files --json``: its exit code, its findings' lines, its document;
    ``text_too``: the text output as well, which must say the same, its summary line last."""
    doc = ingest(env, "audit", source, "--files", "--json", timeout=180)
    assert "Traceback" not in doc.stderr, doc.stderr
    document = json.loads(doc.stdout)
    lines = [f["line"] for f in document["findings"]]
    if text_too:
        text = ingest(env, "audit", source, "--files", timeout=180)
        assert "Traceback" not in text.stderr, text.stderr
        assert text.returncode == doc.returncode, (text.returncode, doc.returncode)
        assert text.stdout.splitlines()[:-1] == lines
        lines = text.stdout.splitlines()
    return doc.returncode, lines, document


def local(uri: str) -> Path:
    assert uri.startswith("file://"), uri
    return Path(uri[len("file://") :])


@contextmanager
def changed(database_url: str, do: str, undo: str, *params: Any) -> Iterator[None]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(do, params)
        try:
            yield
        finally:
            conn.execute(undo, params)


@contextmanager
def segment_deleted(database_url: str, segment_id: int) -> Iterator[None]:
    """The segment's rows gone from the metastore (its ranges, its table records), restored after."""
    tables = ("ingest_segment_ranges", "ingest_table_segments", "ingest_segments")
    with psycopg.connect(database_url, autocommit=True) as conn:
        saved: dict[str, list[tuple[Any, ...]]] = {}
        columns: dict[str, list[str]] = {}
        for table in tables:
            key = "id" if table == "ingest_segments" else "segment_id"
            cur = conn.execute(f"DELETE FROM {table} WHERE {key} = %s RETURNING *", (segment_id,))
            columns[table] = [d.name for d in cur.description or ()]
            saved[table] = cur.fetchall()
        try:
            yield
        finally:
            for table in reversed(tables):
                for row in saved[table]:
                    names = ", ".join(columns[table])
                    marks = ", ".join(["%s"] * len(row))
                    conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", row)


def some_values(i: int) -> bytes:
    return b"{not json" if i % 50 == 7 else sample_value(i)


def test_audit_passes_on_a_clean_source_and_finds_each_injected_defect(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    new_source: NewSource,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    source, produced = new_source(2, max_records=400, max_age="1s", store=f"file://{tmp_path}/store")
    topic = produced.topic
    produced.produce(2000, some_values)
    worker = start_worker(settings(database_url, kafka_bootstrap), source, spark_builder)
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 180, "the worker to catch up")
    worker.stop()
    assert worker.error is None
    env = process_env(database_url, kafka_bootstrap)
    assert ingest(env, "table-enable", source).returncode == 0
    committed = ingest(env, "table-commit", source, "--once", timeout=180)
    assert committed.returncode == 0, committed.stdout + committed.stderr

    code, lines, doc = audit(env, source, text_too=True)
    assert code == 0 and doc["ok"] and doc["tables"] == ["data", "rejects"], lines
    assert lines[-1].startswith(f"audit {source}: OK (2 partition(s), ")
    with Metastore(database_url) as store:
        segments = store.current_segments(source)
        last = store.last_audit(source)
    assert last is not None and last["findings"] == 0 and last["tables"]
    assert doc["files_read"] == sum(len(s["files"]) + len(s["rejects_files"]) for s in segments)
    assert any(s["rejects_files"] for s in segments)
    # A segment with a data file that follows another segment in its partition.
    firsts: dict[int, int] = {}
    for s in segments:
        for r in s["ranges"]:
            firsts[r["partition"]] = min(firsts.get(r["partition"], r["start"]), r["start"])
    victim = next(s for s in segments if s["files"] and s["ranges"][0]["start"] > firsts[s["ranges"][0]["partition"]])
    vid, vrange, vfile = victim["id"], victim["ranges"][0], victim["files"][0]
    part, start, end = vrange["partition"], vrange["start"], vrange["end"]
    before = next(s for s in segments if any(r["partition"] == part and r["end"] == start for r in s["ranges"]))

    # A data file deleted from the store.
    moved = local(vfile).with_name("moved-away")
    local(vfile).rename(moved)
    code, lines, _ = audit(env, source, text_too=True)
    moved.rename(local(vfile))
    assert code == 1
    assert f"missing_file: segment {vid} file {vfile}: listed by the segment, not in the store" in lines

    # A doctored row count.
    rows = victim["row_count"]
    with changed(
        database_url,
        "UPDATE ingest_segments SET row_count = row_count + 1 WHERE id = %s",
        "UPDATE ingest_segments SET row_count = row_count - 1 WHERE id = %s",
        vid,
    ):
        code, lines, _ = audit(env, source)
    assert code == 1
    files = len(victim["files"])
    assert (
        f"row_count: segment {vid}: its {files} data file(s) hold {rows} row(s), the segment says {rows + 1}" in lines
    )

    # An overlapping range: the victim's starts one offset early.
    with changed(
        database_url,
        "UPDATE ingest_segment_ranges SET start_offset = start_offset - 1 WHERE segment_id = %s",
        "UPDATE ingest_segment_ranges SET start_offset = start_offset + 1 WHERE segment_id = %s",
        vid,
    ):
        code, lines, _ = audit(env, source)
    assert code == 1
    overlap = (
        f"overlap: {topic}[{part}] epoch 0: offsets [{start - 1}, {start}) "
        f"are in segment {vid} and in segment {before['id']}"
    )
    assert overlap in lines, lines

    # A hole: the victim's segment row deleted (its files then are in the table and in no segment).
    with segment_deleted(database_url, vid):
        code, lines, _ = audit(env, source)
    assert code == 1
    assert f"hole: {topic}[{part}] epoch 0: offsets [{start}, {end}) are in no segment and no skipped gap" in lines
    assert any(line.startswith("table_extra_file: table ") and vfile in line for line in lines), lines

    # A file whose footer's offsets lie outside the segment's range (same rows, offsets moved).
    saved = tmp_path / "saved.parquet"
    shutil.copy(local(vfile), saved)
    table = pq.read_table(local(vfile))
    shifted = table.set_column(
        table.schema.get_field_index("_offset"), "_offset", pc.add(table.column("_offset"), 1_000_000)
    )
    pq.write_table(shifted, local(vfile))
    code, lines, _ = audit(env, source)
    shutil.copy(saved, local(vfile))
    assert code == 1
    assert any(
        line.startswith(f"file_offsets: segment {vid} file {vfile}: its rows of {topic}[{part}] hold offsets ")
        for line in lines
    ), lines

    assert audit(env, source)[0] == 0  # every defect undone

    # The table: one of its data files removed, then a file no segment lists added.
    catalog = MetastoreCatalog(database_url)
    try:
        iceberg = catalog.load_table(identifier(source, TableKind.DATA))
        data_file = next(t.file for t in iceberg.scan().plan_files() if t.file.file_path == vfile)
        with iceberg.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
            overwrite.delete_data_file(data_file)
        code, lines, _ = audit(env, source)
        assert code == 1
        name = ".".join(identifier(source, TableKind.DATA))
        missing = (
            f"table_missing_file: table {name} file {vfile}: "
            f"segment {vid} is recorded as held by the table, which does not list this file"
        )
        assert lines == [missing]
        extra = local(vfile).with_name("extra.parquet")
        shutil.copy(saved, extra)
        catalog.load_table(identifier(source, TableKind.DATA)).add_files([f"file://{extra}"])
        code, lines, _ = audit(env, source)
        assert code == 1
        assert lines == [
            missing,
            f"table_extra_file: table {name} file file://{extra}: listed by the table, by no current segment",
        ]
    finally:
        catalog.close()
