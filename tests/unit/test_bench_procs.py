"""The benchmark's worker processes: one log per worker, never shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.procs import ProcStat, WorkerProcess, read_stat, tree_rss_bytes


def test_a_worker_name_already_logged_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # Repeated runs once reused a name, truncated the earlier run's log and counted the last
    # run's publishes once per run.
    (tmp_path / "ingest_1-0.log").write_text('{"event": "segment_published", "publish_ms": 1.0}\n')

    with pytest.raises(FileExistsError):
        WorkerProcess("ingest_1-0", "src", {}, tmp_path, 0, tmp_path).start()

    assert (tmp_path / "ingest_1-0.log").read_text().startswith('{"event": "segment_published"')


def test_a_child_that_has_not_exec_d_yet_is_not_counted_twice() -> None:
    gib = 2**30
    tree = {
        10: ProcStat(ppid=1, cpu_s=0.0, rss_bytes=1 * gib, comm="python3"),
        11: ProcStat(ppid=10, cpu_s=0.0, rss_bytes=0, comm="bash"),
        12: ProcStat(ppid=11, cpu_s=0.0, rss_bytes=2 * gib, comm="java"),
        # The JVM spawning chmod: until exec the child shares the JVM's pages and reports them.
        13: ProcStat(ppid=12, cpu_s=0.0, rss_bytes=2 * gib, comm="java"),
        14: ProcStat(ppid=12, cpu_s=0.0, rss_bytes=gib // 1024, comm="chmod"),
    }
    assert tree_rss_bytes(tree, 10) == 3 * gib + gib // 1024


def test_read_stat_gives_the_command_name_and_rss_of_a_live_process() -> None:
    st = read_stat(os.getpid())
    assert st is not None and st.comm.startswith("python") and st.rss_bytes > 0 and st.ppid == os.getppid()
