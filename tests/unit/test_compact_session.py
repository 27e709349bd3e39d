"""The compactor's Spark session after a failed job (ingest.compact.job): it asks the one owner
of its session (ingest.spark.start.session_source); under Spark Connect a session the server
lost is replaced by the next job (a restarted server lost it: every call on it would fail)
and not released on the dead server; a local session is kept. Fakes stand in for Spark's
sessions; the chaos run's ``spark`` fault under ``--spark connect`` is the real server restart."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PySparkRuntimeError

from ingest.compact.job import Compactor
from ingest.compact.plan import Candidate, Chunk
from ingest.errors import SparkDriverExited
from ingest.spark import connect
from ingest.spark.session import SessionSource
from ingest.spark.start import session_source
from ingest.spec.parse import spec_from_dict
from ingest_common.model import PartitionBy, TopicPartition
from ingest_dev.testkit import wait_until


class LostSession:
    """A session whose every job fails as one the server no longer has."""

    release_session_on_close = True
    made = 0

    def __init__(self) -> None:
        LostSession.made += 1
        self.session_id = f"s{LostSession.made}"
        self.is_stopped = False
        self.stopped_with_release: bool | None = None

    @property
    def read(self) -> Any:
        raise PySparkRuntimeError(errorClass="NO_ACTIVE_SESSION", messageParameters={})

    def addTag(self, tag: str) -> None:
        """Client-side only under Spark Connect: it works on a lost session too."""

    def removeTag(self, tag: str) -> None:
        """As addTag."""

    def stop(self) -> None:
        self.stopped_with_release = self.release_session_on_close
        self.is_stopped = True


def rewrite_twice(tmp_path: Path, master: str, monkeypatch: pytest.MonkeyPatch) -> list[LostSession]:
    """Two jobs of one compactor, both failing; returns the sessions it used."""
    data = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"_partition": [0], "_offset": [0]}), data)
    spec = spec_from_dict(
        {"name": "src", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": "/r"}
    )
    seg = Candidate(1, TopicPartition("t", 0), 0, 1, 0, 1, (f"file://{data}",), 1, 10, ())
    made: list[LostSession] = []

    def new_session(*_args: Any, **_kwargs: Any) -> LostSession:
        made.append(LostSession())
        return made[-1]

    # A Connect session the owner makes again: no server here.
    monkeypatch.setattr(connect, "connect_session", new_session)

    def sessions(_spec: Any) -> SessionSource:
        return session_source(master, "ingest-compact", new_session(), retry_s=1.0)

    compactor = Compactor(store=None, sessions=sessions, worker_id="c")  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(PySparkRuntimeError):
            compactor._rewrite(spec, PartitionBy.NONE, Chunk((seg, seg)), uuid.uuid4(), str(tmp_path / "out"))
    return made


def test_a_lost_connect_session_is_replaced_by_the_next_job_without_releasing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = rewrite_twice(tmp_path, "sc://127.0.0.1:1", monkeypatch)
    assert len(made) == 2
    # Closed off the job's thread, never released on a server that no longer has it.
    wait_until(lambda: made[0].stopped_with_release is not None, 10, "the lost session to close")
    assert made[0].stopped_with_release is False
    assert made[1].stopped_with_release is None


def test_a_local_session_is_kept_after_a_failed_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = rewrite_twice(tmp_path, "local[1]", monkeypatch)
    assert len(made) == 1 and made[0].stopped_with_release is None


class DeadDriverSession(LostSession):
    """A local driver's session whose JVM was killed: calls fail as Py4J's do, and the
    process pyspark launched has exited."""

    def __init__(self) -> None:
        super().__init__()
        process = type("Process", (), {"poll": lambda _self: -9})()
        self.sparkContext = type("Context", (), {"_gateway": type("Gateway", (), {"proc": process})()})()

    @property
    def read(self) -> Any:
        from py4j.protocol import Py4JNetworkError

        raise Py4JNetworkError("Answer from Java side is empty")

    def addTag(self, tag: str) -> None:
        """A call into the JVM, as every call of a classic session's is: the first to fail."""
        from py4j.protocol import Py4JNetworkError

        raise Py4JNetworkError("Answer from Java side is empty")


def test_a_compactor_whose_driver_jvm_exited_raises_driver_exited_on_its_next_job(tmp_path: Path) -> None:
    data = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"_partition": [0], "_offset": [0]}), data)
    spec = spec_from_dict(
        {"name": "src", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": "/r"}
    )
    seg = Candidate(1, TopicPartition("t", 0), 0, 1, 0, 1, (f"file://{data}",), 1, 10, ())
    session = DeadDriverSession()
    compactor = Compactor(
        store=None,  # type: ignore[arg-type]
        sessions=lambda _spec: session_source("local[2]", "ingest-compact", session, retry_s=1.0),
        worker_id="c",
    )
    from py4j.protocol import Py4JNetworkError

    with pytest.raises(Py4JNetworkError):  # a Spark failure: the role retries its pass
        compactor._rewrite(spec, PartitionBy.NONE, Chunk((seg, seg)), uuid.uuid4(), str(tmp_path / "out"))
    # Not one the role retries (ingest.compact.runner): it exits, and is restarted.
    with pytest.raises(SparkDriverExited):
        compactor._rewrite(spec, PartitionBy.NONE, Chunk((seg, seg)), uuid.uuid4(), str(tmp_path / "out"))
    compactor.stop()
    assert session.stopped_with_release is None  # a dead JVM is not asked to stop


def test_the_compactor_role_counts_what_its_connect_session_went_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ingest compact``'s sessions (ingest.cli.compact.compactor_sessions) report to the role's
    /metrics as a worker's do: a session the server lost, then the fresh one that replaced it."""
    from ingest.cli.compact import compactor_sessions
    from ingest.compact.metrics import CompactionMetrics
    from ingest.config import Settings
    from ingest.spark import start as spark

    data = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"_partition": [0], "_offset": [0]}), data)
    spec = spec_from_dict(
        {"name": "src", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": "/r"}
    )
    seg = Candidate(1, TopicPartition("t", 0), 0, 1, 0, 1, (f"file://{data}",), 1, 10, ())
    monkeypatch.setattr(spark, "create_session_within", lambda *_a, **_k: LostSession())
    monkeypatch.setattr(connect, "connect_session", lambda *_a, **_k: LostSession())
    metrics = CompactionMetrics("src")
    settings = Settings(database_url="postgresql://unused", kafka_bootstrap="unused", spark_master="sc://127.0.0.1:1")
    compactor = Compactor(store=None, sessions=compactor_sessions(settings, metrics), worker_id="c")  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(PySparkRuntimeError):
            compactor._rewrite(spec, PartitionBy.NONE, Chunk((seg, seg)), uuid.uuid4(), str(tmp_path / "out"))
    compactor.stop()

    def count(event: str) -> float | None:
        return metrics.registry.get_sample_value("ingest_spark_connect_events_total", {"source": "src", "event": event})

    assert count("session_lost") == 2
    assert count("session_recreated") == 1
    assert count("unreachable") == 0
