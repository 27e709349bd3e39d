"""The compactor's Spark session after a failed job (ingest.compact.job): under Spark Connect it
is dropped and the next job makes a new one (a restarted server lost it: every call on it
would fail); a local session is kept. Fakes stand in for Spark; the chaos run's ``spark`` fault
under ``--spark connect`` is the real server restart."""

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
from ingest.spec import spec_from_dict
from ingest_common.model import TopicPartition


class LostSession:
    """A session whose every job fails as one the server no longer has."""

    release_session_on_close = True

    def __init__(self) -> None:
        self.stopped_with_release: bool | None = None

    @property
    def read(self) -> Any:
        raise PySparkRuntimeError(errorClass="NO_ACTIVE_SESSION", messageParameters={})

    def stop(self) -> None:
        self.stopped_with_release = self.release_session_on_close


class ConnectSession(LostSession):
    pass


class LocalSession(LostSession):
    pass


ConnectSession.__module__ = "pyspark.sql.connect.session"
LocalSession.__module__ = "pyspark.sql.session"


def rewrite_twice(tmp_path: Path, kind: type[LostSession]) -> list[LostSession]:
    """Two jobs of one compactor, both failing; returns the sessions it made."""
    data = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"_partition": [0], "_offset": [0]}), data)
    spec = spec_from_dict(
        {"name": "src", "topics": ["t"], "event_time": "ts", "schema": {"ts": "timestamp"}, "segment_store": "/r"}
    )
    seg = Candidate(1, TopicPartition("t", 0), 0, 1, 0, 1, (f"file://{data}",), 1, 10, ())
    made: list[LostSession] = []

    def factory(_spec: Any) -> LostSession:
        made.append(kind())
        return made[-1]

    compactor = Compactor(store=None, spark=factory, worker_id="c")  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(PySparkRuntimeError):
            compactor._rewrite(spec, Chunk((seg, seg)), uuid.uuid4(), str(tmp_path / "out"))
    return made


def test_a_connect_session_is_dropped_after_a_failed_job_without_waiting_to_release_it(tmp_path: Path) -> None:
    made = rewrite_twice(tmp_path, ConnectSession)
    assert len(made) == 2
    assert made[0].stopped_with_release is False


def test_a_local_session_is_kept_after_a_failed_job(tmp_path: Path) -> None:
    made = rewrite_twice(tmp_path, LocalSession)
    assert len(made) == 1 and made[0].stopped_with_release is None
