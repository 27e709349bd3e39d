"""Runs a bench module as the operator would, under a hang guard, for the smoke tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest_dev.process import popen

REPO = Path(__file__).resolve().parents[2]


def run_bench(args: list[str], timeout_s: float, grace_s: float = 90) -> str:
    """``python -m <args>`` from the repository; its stdout, after asserting exit 0.

    Past ``timeout_s`` it gets SIGTERM, not SIGKILL: a bench then stops its workers, broker and
    PostgreSQL (and a compaction's process group) before the test fails."""
    proc = popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"python -m {args[0]} did not finish in {timeout_s} s\n{stderr[-3000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    return stdout
