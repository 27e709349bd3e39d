"""The benchmark's worker processes: one log per worker, never shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.procs import WorkerProcess


def test_a_worker_name_already_logged_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # Repeated runs once reused a name, truncated the earlier run's log and counted the last
    # run's publishes once per run.
    (tmp_path / "ingest_1-0.log").write_text('{"event": "segment_published", "publish_ms": 1.0}\n')

    with pytest.raises(FileExistsError):
        WorkerProcess.start("ingest_1-0", "src", {}, tmp_path, 0, tmp_path)

    assert (tmp_path / "ingest_1-0.log").read_text().startswith('{"event": "segment_published"')
