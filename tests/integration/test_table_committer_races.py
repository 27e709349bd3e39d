"""Table committers that do not exclude each other, against a real PostgreSQL (catalog and
metastore) and real pyiceberg: two committers that both found no table (the advisory lock
bypassed, as after a PostgreSQL restart or with ``--once`` beside a running committer) create
it at once and still append every offset once; sources whose old 32-bit lock keys collide each
get a committer; ``/healthz`` and ``/readyz`` say when a committer cannot do its job and which
one commits."""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import NoSuchTableError

from ingest.ops.endpoints import Endpoints
from ingest.segments.store import filesystem
from ingest.table.catalog import MetastoreCatalog, identifier
from ingest.table.committer import COMMIT_SEQ, TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.runner import run_committer
from ingest_dev.testkit import free_port
from metastore.tables import TableKind, TableStore
from tests.integration.iceberg_harness import Source, assert_eventually, gauge, run_cli

FAST = CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1)


@pytest.fixture
def src(database_url: str, tmp_path: Path) -> Iterator[Source]:
    source = Source(database_url, f"file://{tmp_path}/store")
    yield source
    source.store.close()


def table_rows(database_url: str, source: str) -> Counter[tuple[int, int]]:
    """How often each (_partition, _offset) is in the data table."""
    catalog = MetastoreCatalog(database_url)
    try:
        table = catalog.load_table(identifier(source, TableKind.DATA))
        rows = table.scan(selected_fields=("_partition", "_offset")).to_arrow().to_pylist()
    finally:
        catalog.close()
    return Counter((r["_partition"], r["_offset"]) for r in rows)


def published_rows(src: Source) -> Counter[tuple[int, int]]:
    rows: Counter[tuple[int, int]] = Counter()
    for segment in src.store.segments(src.name):
        for f in segment["files"]:
            fs, path = filesystem(f)
            table = pq.read_table(path, filesystem=fs, columns=["_partition", "_offset"])
            rows.update((r["_partition"], r["_offset"]) for r in table.to_pylist())
    return rows


def assert_each_offset_once_and_seq_agrees(database_url: str, src: Source) -> None:
    held = table_rows(database_url, src.name)
    published = published_rows(src)
    assert set(published.values()) == {1}
    twice = sorted(k for k, n in held.items() if n > 1)
    assert not twice, f"{len(twice)} offsets in the table more than once ({sum(held.values())} rows)"
    assert held == published
    catalog = MetastoreCatalog(database_url)
    try:
        held_seq = int(catalog.load_table(identifier(src.name, TableKind.DATA)).properties[COMMIT_SEQ])
    finally:
        catalog.close()
    with TableStore(database_url) as store:
        row = store.table(src.name, TableKind.DATA)
        assert row.committed_seq == held_seq
        assert store.behind(src.name, TableKind.DATA)[0] == 0


def without_lock(monkeypatch: pytest.MonkeyPatch, committer: TableCommitter) -> None:
    """The advisory lock always granted: nothing but the table itself keeps committers apart."""
    monkeypatch.setattr(committer.store, "try_lock", lambda source: True)


def conflicts(c: TableCommitter) -> float:
    return gauge(c.metrics, "ingest_table_commit_conflicts_total", source=c.source, table="data") or 0.0


@pytest.mark.parametrize("rival", ["before_create", "inside_create"])
def test_committers_that_both_found_no_table_append_each_offset_once(
    database_url: str, src: Source, monkeypatch: pytest.MonkeyPatch, rival: str
) -> None:
    """``second`` (running, its lock always granted) chose its batch from "no table"; ``first``
    then creates the table and appends that batch, at one of two points of ``second``'s create:
    before it (the catalog refuses the create: CommitFailedException), or between the catalog's
    look for the table and its insert (TableAlreadyExistsError). ``second`` must start over from
    the table it finds, never append its batch to it, and keep running."""
    src.publish(10)
    src.publish(10)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    first, second = TableCommitter(database_url, src.name, FAST), TableCommitter(database_url, src.name, FAST)
    for c in (first, second):
        without_lock(monkeypatch, c)
    rival_done: list[object] = []
    real_create = second.catalog.create_table_transaction
    real_load = second.catalog.load_table
    creating: list[bool] = []

    def rival_commits() -> None:
        rival_done.append(first.commit_batch(TableKind.DATA))

    if rival == "before_create":

        def create_after_rival(*args: Any, **kwargs: Any) -> Any:
            if not rival_done:
                rival_commits()
            return real_create(*args, **kwargs)

        monkeypatch.setattr(second.catalog, "create_table_transaction", create_after_rival)
    else:

        def create_marked(*args: Any, **kwargs: Any) -> Any:
            creating.append(True)
            return real_create(*args, **kwargs)

        def load_then_rival(ident: Any) -> Any:
            # The catalog's own look for the table inside the create's commit: it finds none,
            # and the rival creates the table (and appends) before the create's insert.
            if creating and not rival_done:
                rival_commits()
                raise NoSuchTableError(str(ident))
            return real_load(ident)

        monkeypatch.setattr(second.catalog, "create_table_transaction", create_marked)
        monkeypatch.setattr(second.catalog, "load_table", load_then_rival)

    stop = threading.Event()
    runner = threading.Thread(target=run_committer, args=(second, stop))
    runner.start()
    try:
        assert_eventually(lambda: bool(rival_done) and second.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
        assert_each_offset_once_and_seq_agrees(database_url, src)
        # The loser met the winner's table as a conflict, and goes on committing.
        assert conflicts(second) >= 1
        src.publish(5)
        assert_eventually(lambda: second.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
    finally:
        stop.set()
        runner.join(timeout=60)
        first.close()
        second.close()
    assert not runner.is_alive()
    assert_each_offset_once_and_seq_agrees(database_url, src)


def colliding_names(database_url: str) -> tuple[str, str]:
    """Two valid source names with the same 32-bit ``hashtext`` (the old lock key), found by
    brute force over a bounded set (about 10 pairs are expected among 300,000 names)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT array_agg(n ORDER BY n) FROM (SELECT 's' || i AS n FROM generate_series(1, 300000) i) s "
            "GROUP BY hashtext(n) HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
    assert row is not None, "no two names share a 32-bit hash among 300,000"
    a, b = row[0][:2]
    return str(a), str(b)


def test_sources_whose_old_32_bit_lock_keys_collide_each_get_an_active_committer(
    database_url: str, tmp_path: Path
) -> None:
    names = colliding_names(database_url)
    with psycopg.connect(database_url) as conn:
        hashes = conn.execute("SELECT hashtext(%s), hashtext(%s)", names).fetchone()
    assert hashes is not None and hashes[0] == hashes[1]
    sources = [Source(database_url, f"file://{tmp_path}/store", name=name) for name in names]
    committers = [TableCommitter(database_url, name, FAST) for name in names]
    stop = threading.Event()
    runners = [threading.Thread(target=run_committer, args=(c, stop)) for c in committers]
    try:
        for source in sources:
            source.publish(4)
            enable_table(database_url, source.name, PartitionBy.NONE, RejectsMode.NONE)
        for runner in runners:
            runner.start()
        for c, runner in zip(committers, runners, strict=True):
            assert_eventually(
                lambda c=c: (
                    gauge(c.metrics, "ingest_table_committer_active", source=c.source) == 1
                    and c.store.behind(c.source, TableKind.DATA)[0] == 0
                ),
                runner,
            )
        # Both hold their lock at once.
        assert all(gauge(c.metrics, "ingest_table_committer_active", source=c.source) == 1 for c in committers)
        with psycopg.connect(database_url) as conn:
            held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").fetchone()
        assert held == (2,)
    finally:
        stop.set()
        for runner in runners:
            if runner.ident is not None:
                runner.join(timeout=60)
        for c in committers:
            c.close()
        for source in sources:
            source.store.close()
    for source in sources:
        assert_each_offset_once_and_seq_agrees(database_url, source)


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_fails_while_every_pass_fails_and_readyz_tells_the_active_committer_from_a_standby(
    database_url: str, src: Source, tmp_path: Path
) -> None:
    src.publish(5)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    settings = CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1, unhealthy_after_s=1.0)
    committers = [TableCommitter(database_url, src.name, settings) for _ in range(2)]
    # As `ingest table-commit` serves them.
    endpoints = [Endpoints(c.metrics.registry, c.health.healthy, c.health.ready) for c in committers]
    active, standby = (e.serve("127.0.0.1", 0) for e in endpoints)
    stops = [threading.Event(), threading.Event()]
    runners = [
        threading.Thread(target=run_committer, args=(c, stop)) for c, stop in zip(committers, stops, strict=True)
    ]
    try:
        runners[0].start()
        assert_eventually(lambda: probe(active, "/readyz") == (200, "active\n"), runners[0])
        runners[1].start()
        assert_eventually(lambda: probe(standby, "/healthz") == (200, "standby\n"), runners[1])
        status, body = probe(standby, "/readyz")
        assert status == 503 and body.startswith("standby: another committer holds the lock")
        # The next segment's file cannot be read: every pass of the active committer fails.
        segment = src.publish(3)
        (lost,) = next(s["files"] for s in src.store.segments(src.name) if s["id"] == segment)
        hidden = tmp_path / "hidden.parquet"
        Path(lost.removeprefix("file://")).rename(hidden)
        assert_eventually(lambda: probe(active, "/healthz")[0] == 503, runners[0])
        status, body = probe(active, "/healthz")
        assert "failed in a row" in body and body.endswith("\n") and body.count("\n") == 1, body
        assert probe(active, "/readyz")[0] == 503
        assert probe(standby, "/healthz") == (200, "standby\n")  # nothing wrong with a standby
        # The file is back: the next pass commits it and the committer is healthy again.
        hidden.rename(lost.removeprefix("file://"))
        assert_eventually(lambda: probe(active, "/healthz") == (200, "active\n"), runners[0])
        assert_eventually(lambda: committers[0].store.behind(src.name, TableKind.DATA)[0] == 0, runners[0])
        # The active committer stops: it says so, and the standby takes over.
        stops[0].set()
        runners[0].join(timeout=60)
        status, body = probe(active, "/healthz")
        assert status == 503 and body.startswith("stopped"), body
        assert_eventually(lambda: probe(standby, "/readyz") == (200, "active\n"), runners[1])
    finally:
        for stop in stops:
            stop.set()
        for runner in runners:
            if runner.ident is not None:
                runner.join(timeout=60)
        for e in endpoints:
            e.close()
        for c in committers:
            c.close()
    assert_each_offset_once_and_seq_agrees(database_url, src)


def test_ingest_table_commit_serves_the_committers_health(database_url: str, src: Source) -> None:
    """The CLI serves the committer's own checks (it answered 200 "ok" whatever happened)."""
    src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    port = free_port()
    proc = run_cli(
        database_url,
        "table-commit",
        src.name,
        "--interval",
        "0",
        env={"INGEST_METRICS_HOST": "127.0.0.1", "INGEST_METRICS_PORT": str(port)},
    )
    try:
        seen: tuple[int, str] = (0, "")
        for _ in range(600):  # bounded: 0.1 s per attempt while the process lives
            try:
                seen = probe(port, "/readyz")
            except OSError:
                seen = (0, "not serving yet")
            if seen == (200, "active\n") or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert seen == (200, "active\n"), seen
        assert probe(port, "/healthz") == (200, "active\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
