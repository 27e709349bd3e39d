"""An upsert source end to end on real servers (Apache Kafka, PostgreSQL, worker processes with
Spark, the committer's Spark MERGE INTO): a keyed changelog with inserts, updates and tombstones,
produced while a worker is SIGKILLed and a committer is SIGKILLed between its merge and its swap.
The table read back with pyiceberg and with Spark equals the last state per key computed from the
log as Kafka holds it, and the audit (``ingest audit --files``'s checks) finds nothing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from ingest.table.catalog import identifier, source_catalog
from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.kafka_clients import produce_records, read_records
from ingest_dev.process import popen
from ingest_dev.testkit import wait_until
from ingest_dev.verify import published_positions
from metastore import Metastore
from metastore.tables import TableKind
from tests.acceptance.harness import REPO, apply_spec, process_env
from tests.acceptance.test_cli import ingest
from tests.acceptance.test_compaction import killed_at_pause
from tests.fixtures.servers import MakeTopic
from tests.integration.iceberg_harness import audit_findings

pytestmark = pytest.mark.process

KEYS = 40


def changes(rng: random.Random, first: int, n: int) -> list[tuple[int, bytes, bytes | None]]:
    """``n`` changes of random keys, each key on its own partition (key % 2), one in six a tombstone."""
    out = []
    for i in range(first, first + n):
        k = rng.randrange(KEYS)
        value = None if rng.random() < 1 / 6 else json.dumps({"id": k, "user": f"u{i}", "ts": "2026-11-22T10:00:00Z"})
        out.append((k % 2, str(k).encode(), None if value is None else value.encode()))
    return out


def last_state(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[str, str]:
    """The last state per key of the log as Kafka holds it, in offset order per partition."""
    state: dict[str, str] = {}
    for _partition, _offset, key, value in read_records(bootstrap, topic, ends):
        assert key is not None
        if value is None:
            state.pop(key.decode(), None)
        else:
            state[key.decode()] = json.loads(value)["user"]
    return state


def test_a_changelog_under_worker_and_committer_kills_is_the_last_state_per_key(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic, spark: Any
) -> None:
    topic = make_topic(2, prefix="cdc")
    name = "cdc" + uuid.uuid4().hex[:8]
    spec = tmp_path / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\ntopics = ["{topic}"]\nevent_time = "ts"\nkey_format = "string"\n'
        f'segment_store = "{tmp_path / "store"}"\n'
        '[schema]\nid = "long"\nuser = "string"\nts = "timestamp"\n'
        '[split]\nmax_records = 100\nmax_age = "1s"\n'
        '[table]\nmode = "upsert"\nkey = ["_key_string"]\n'
    )
    apply_spec(database_url, spec)
    env = process_env(database_url, kafka_bootstrap, INGEST_WARM_UP_RECORDS="0")
    assert ingest(env, "table-enable", name).returncode == 0
    rng = random.Random(41)
    ends = produce_records(kafka_bootstrap, topic, changes(rng, 0, 800))

    def published(store: Metastore, want: dict[int, int]) -> bool:
        positions = published_positions(store, name)
        return all((positions.get((topic, p)) or 0) >= end for p, end in want.items())

    workers = [IngestProcess.worker(env, name, tmp_path, f"w{i}") for i in range(2)]
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: len(store.segments(name)) >= 2, 120, "the first segments published")
            # A worker SIGKILLed mid-stream: its partitions go to the other one, from the metastore's offsets.
            workers[0].kill()
            more = produce_records(kafka_bootstrap, topic, changes(rng, 800, 800))
            ends = {p: max(ends.get(p, 0), more.get(p, 0)) for p in set(ends) | set(more)}
            # A committer SIGKILLed between its merge (on its branch) and the swap that makes it the table.
            fault = {**env, "INGEST_FAULT_TABLE_PAUSE_AT": "upsert_staged"}
            proc = popen(
                [sys.executable, "-m", "ingest", "table-commit", name, "--interval", "0"],
                env=fault, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert any("table_fault_pause" in line for line in killed_at_pause(proc, "table_fault_pause", 180))
            workers.append(IngestProcess.worker(env, name, tmp_path, "w2"))
            wait_until(lambda: published(store, ends), 180, "every change published")
    finally:
        for w in workers:
            w.stop(timeout=60)
    # The rest merged in this process (on the tests' Spark, which has Iceberg's extensions).
    with TableCommitter(database_url, name, CommitSettings(interval_s=0)) as committer:
        assert committer.commit_all(), "the killed committer's batch, and the rest, merged now"

    expected = last_state(kafka_bootstrap, topic, ends)
    assert 0 < len(expected) < KEYS, "some keys deleted at the end, some alive"
    catalog = source_catalog(database_url, name)
    table = catalog.load_table(identifier(name, TableKind.DATA))
    # The killed committer's branch went with the next commit (its snapshot free to expire).
    assert [ref for ref in table.metadata.refs if ref != "main"] == []
    arrow = table.scan(selected_fields=("_key_string", "user")).to_arrow()
    keys = arrow["_key_string"].to_pylist()
    assert len(keys) == len(set(keys)), "a key is in the table twice"
    assert dict(zip(keys, arrow["user"].to_pylist(), strict=True)) == expected

    from ingest.table.merge import merge_session_conf

    session = spark.newSession()
    for key, value in merge_session_conf(database_url).items():
        if key.startswith("spark.sql.catalog."):
            session.conf.set(key, value)
    read = session.sql(f"SELECT _key_string, user FROM ingest.ingest.{name}").collect()
    assert {r["_key_string"]: r["user"] for r in read} == expected and len(read) == len(expected)

    assert audit_findings(database_url, name) == []
