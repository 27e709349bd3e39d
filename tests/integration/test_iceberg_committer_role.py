"""The table committer as operators run it, against a real PostgreSQL: a committer process
SIGKILLed during a commit loses and duplicates nothing (and what ``ingest table`` and ``ingest query``
then show), one rides out a PostgreSQL restart, and a second one stands by and takes over."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter

from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest.table.runner import run_committer
from ingest_dev.postgres import LocalPostgres
from ingest_dev.testkit import LOOPBACK, free_port
from metastore import apply_migrations
from metastore.tables import TableKind, TableStore
from tests.fixtures.catalogs import CATALOGS, TableCatalog
from tests.integration.iceberg_harness import Source, assert_eventually, assert_exactly_once, gauge, run_cli


@pytest.fixture
def src(database_url: str, table_catalog: TableCatalog) -> Iterator[Source]:
    source = Source(database_url, table_catalog.store, catalog=table_catalog.catalog)
    yield source
    source.store.close()


@pytest.mark.parametrize("table_catalog", CATALOGS, indirect=True)
def test_a_committer_killed_during_a_commit_loses_and_duplicates_nothing(
    database_url: str, src: Source, table_catalog: TableCatalog
) -> None:
    for _ in range(3):
        src.publish(8)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    proc = run_cli(
        database_url,
        "table-commit",
        src.name,
        "--interval",
        "0",
        env={"INGEST_FAULT_TABLE_PAUSE_AT": "iceberg_committed", "INGEST_LOG_FORMAT": "json"},
    )
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:  # ends when the process does: never waits past its exit
            seen.append(line)
            if "table_fault_pause" in line:
                break
        assert any("table_fault_pause" in line for line in seen), "".join(seen)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # Killed right after its catalog swap: the metastore's catalog recorded the commit in the
    # swap's own transaction; another catalog's committer records after it, and did not.
    with TableStore(database_url) as store:
        assert store.table(src.name, TableKind.DATA).committed_seq == (0 if table_catalog.external else 1)
    src.publish(4)
    once = run_cli(database_url, "table-commit", src.name, "--once", "--json")
    out, _ = once.communicate(timeout=120)
    assert once.returncode == 0, out
    assert_exactly_once(database_url, src)
    # What an operator sees: the table's state and a query, as one JSON document each.
    shown = run_cli(database_url, "table", src.name, "--json")
    doc = json.loads(shown.communicate(timeout=120)[0])
    assert doc["schema_version"] == 1
    assert [(t["table"], t["segments_behind"], t["commits"]) for t in doc["tables"]] == [("data", 0, 2)]
    asked = run_cli(database_url, "query", src.name, "SELECT count(*) AS n FROM clicks", "--json")
    assert json.loads(asked.communicate(timeout=120)[0])["rows"] == [[28]]
    bad = run_cli(database_url, "query", src.name, "SELECT nosuch FROM clicks")
    assert bad.communicate(timeout=120)[0].startswith("ingest: error: query over clicks: Binder Error")
    assert bad.returncode == 2
    refused = run_cli(database_url, "table", "nosuch")
    assert refused.communicate(timeout=120)[0].startswith("ingest: error: unknown source")
    assert refused.returncode == 3


def test_the_committer_rides_out_a_postgresql_restart(tmp_path: Path) -> None:
    with LocalPostgres() as pg:
        url = pg.create_database("t")
        apply_migrations(url)
        src = Source(url, f"file://{tmp_path}/store")
        src.publish(5)
        enable_table(url, src.name, PartitionBy.NONE, RejectsMode.NONE)
        stop = threading.Event()
        c = TableCommitter(url, src.name, CommitSettings(batch_segments=1, interval_s=0, poll_s=0.2))
        runner = threading.Thread(target=run_committer, args=(c, stop))
        runner.start()
        try:
            assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
            src.store.close()
            pg.restart(crash=True)
            for _ in range(3):
                src.publish(5)
            assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
        finally:
            stop.set()
            runner.join(timeout=60)
            c.close()
        assert_exactly_once(url, src)
        with psycopg.connect(url) as conn:
            # One committer held the lock throughout and released it on stop.
            assert conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() == (0,)
        src.store.close()


def test_a_second_committer_stands_by_and_takes_over_when_the_first_stops(database_url: str, src: Source) -> None:
    src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    settings = CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1)
    first, second = TableCommitter(database_url, src.name, settings), TableCommitter(database_url, src.name, settings)
    stops = [threading.Event(), threading.Event()]
    runners = [
        threading.Thread(target=run_committer, args=(c, stop)) for c, stop in zip((first, second), stops, strict=True)
    ]
    runners[0].start()
    try:
        assert_eventually(
            lambda: gauge(first.metrics, "ingest_table_commits_total", source="clicks", table="data"), runners[0]
        )
        runners[1].start()
        src.publish(2)
        assert_eventually(
            lambda: gauge(first.metrics, "ingest_table_commits_total", source="clicks", table="data") == 2, runners[0]
        )
        # The standby commits nothing and reports what it sees (nothing behind), not active.
        assert_eventually(
            lambda: gauge(second.metrics, "ingest_table_segments_behind", source="clicks", table="data") == 0,
            runners[1],
        )
        assert gauge(second.metrics, "ingest_table_committer_active", source="clicks") == 0
        assert gauge(second.metrics, "ingest_table_commits_total", source="clicks", table="data") == 0
        stops[0].set()
        runners[0].join(timeout=60)
        src.publish(4)
        assert_eventually(
            lambda: gauge(second.metrics, "ingest_table_commits_total", source="clicks", table="data") == 1, runners[1]
        )
        assert gauge(second.metrics, "ingest_table_committer_active", source="clicks") == 1
    finally:
        for stop in stops:
            stop.set()
        for runner in runners:
            if runner.is_alive() or runner.ident is not None:
                runner.join(timeout=60)
        first.close()
        second.close()
    assert_exactly_once(database_url, src)


def test_an_unreachable_catalog_is_one_line_and_exit_11_for_every_command(database_url: str, tmp_path: Path) -> None:
    """A spec whose [table] catalog does not answer: every command that opens it says so in
    one line and exits 11 (CatalogUnavailable), the committer before it starts its loop."""
    uri = f"http://{LOOPBACK}:{free_port()}/iceberg"  # nothing listens there
    src = Source(database_url, f"file://{tmp_path}/store", catalog={"type": "rest", "uri": uri})
    try:
        src.publish(2)
        with TableStore(database_url) as store:
            store.enable(src.name, TableKind.DATA, "none")  # as if enabled while it answered
        commands = [
            ("table-enable", src.name),
            ("table-commit", src.name),
            ("table", src.name),
            ("query", src.name, "SELECT 1"),
            ("audit", src.name, "--files"),
        ]
        procs = [(args, run_cli(database_url, *args)) for args in commands]
        for args, proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 11, (args, out)
            [line] = out.splitlines()
            assert line.startswith(f"ingest: error: the rest catalog at {uri} is unavailable: "), (args, line)
    finally:
        src.store.close()


class _Unavailable(HTTPAdapter):
    """A REST catalog that refuses connections (requests' ConnectionError, an OSError) and
    answers 503 (pyiceberg's ServiceUnavailableError), in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def send(self, request: PreparedRequest, **kwargs: Any) -> Response:  # type: ignore[override]
        self.calls += 1
        if self.calls % 2:
            raise requests.ConnectionError(f"refused: {request.url}")
        response = Response()
        response.status_code, response.reason, response.url = 503, "Service Unavailable", str(request.url)
        response.request, response._content = request, b""
        return response


@pytest.mark.parametrize("table_catalog", ["rest"], indirect=True)
def test_the_committer_rides_out_a_rest_catalog_outage(database_url: str, src: Source) -> None:
    """The REST catalog stops answering (connections refused, then 503s) while the committer
    runs: each pass fails, is reported (the health's reason) and retried, never the end of the
    committer; once it answers again the published segments are appended, each once."""
    src.publish(3)
    enable_table(database_url, src.name, PartitionBy.NONE, RejectsMode.NONE)
    stop = threading.Event()
    c = TableCommitter(database_url, src.name, CommitSettings(batch_segments=10, interval_s=0, poll_s=0.1))
    errors: list[str] = []
    real_failed = c.health.failed

    def failed(error: str) -> None:
        errors.append(error)
        real_failed(error)

    c.health.failed = failed  # type: ignore[method-assign]
    runner = threading.Thread(target=run_committer, args=(c, stop))
    runner.start()
    try:
        assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
        session = c.catalog._session  # type: ignore[attr-defined]
        working = session.get_adapter("http://")
        session.mount("http://", _Unavailable())
        src.publish(4)
        assert_eventually(lambda: len(errors) >= 3, runner)
        assert c.store.behind(src.name, TableKind.DATA)[0] == 1
        session.mount("http://", working)
        assert_eventually(lambda: c.store.behind(src.name, TableKind.DATA)[0] == 0, runner)
    finally:
        stop.set()
        runner.join(timeout=60)
        c.close()
    assert {e.split(":")[0] for e in errors} == {"refused", "ServiceUnavailableError"}, errors
    assert_exactly_once(database_url, src)
