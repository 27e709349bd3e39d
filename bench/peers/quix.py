"""Finding, setting up and running the peer (Quix Streams) from the project's environment.

quixstreams 3.28.1 requires ``confluent-kafka<2.13``; the project pins 2.16.1, so installing it
beside the project would downgrade the client the workers use.  The peer therefore runs under
its own virtualenv's Python (``python -m bench --setup-peer`` creates it) and ``quix_app.py``
is started as a plain script there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.stats import file_sink_row
from ingest_dev.process import run_process

QUIX_VERSION = "3.28.1"
PYARROW_VERSION = "26.0.1"  # same as the project, so both write Parquet with the same library
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ingest-bench" / "quix-venv"
SCRIPT = Path(__file__).resolve().parent / "quix_app.py"


def _has_quix(python: str) -> bool:
    try:
        proc = subprocess.run(
            [python, "-c", "import quixstreams"],
            capture_output=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def find_python(explicit: str | None) -> tuple[str | None, str]:
    """The Python to run the peer with, or None and why not."""
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    if os.environ.get("BENCH_QUIX_PYTHON"):
        candidates.append(os.environ["BENCH_QUIX_PYTHON"])
    candidates.append(str(DEFAULT_VENV / "bin" / "python"))
    candidates.append(sys.executable)
    for python in candidates:
        if (Path(python).exists() or shutil.which(python)) and _has_quix(python):
            return python, ""
    return None, (
        f"quixstreams not installed (run `python -m bench --setup-peer`: it needs its own virtualenv, "
        f"quixstreams {QUIX_VERSION} requires confluent-kafka<2.13)"
    )


def setup_venv(venv: Path = DEFAULT_VENV) -> str:
    """Create the peer's virtualenv with pinned quixstreams and pyarrow; returns its Python."""
    python = venv / "bin" / "python"
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"quixstreams=={QUIX_VERSION}", f"pyarrow=={PYARROW_VERSION}"],
        check=True,
        timeout=900,
    )
    return str(python)


def run(
    python: str,
    bootstrap: str,
    topic: str,
    records: int,
    value_bytes: int,
    work: Path,
    commit_interval: float,
    timeout: float,
) -> dict[str, Any]:
    """Run the peer to completion over the topic; the measured span is its first record to its last write."""
    # The sink refuses '-' and most punctuation in its directory: give it a clean relative one.
    run_dir = work / "peer"
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "result.json"
    log_path = run_dir / "peer.log"
    cmd = [
        python,
        str(SCRIPT),
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        f"bench-quix-{uuid.uuid4().hex[:8]}",
        "--expected",
        str(records),
        "--directory",
        "quix_out",
        "--commit-interval",
        str(commit_interval),
        "--timeout",
        str(timeout),
        "--result",
        str(result_path),
    ]
    # Not the project's environment: no PYTHONPATH into the repo, quiet deprecation warnings.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    started = time.time()
    with log_path.open("wb") as log:
        proc = run_process(
            cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout + 60, check=False
        )
    if not result_path.exists():
        tail = log_path.read_text(errors="replace")[-2000:]
        return {"status": "n/a", "reason": f"peer exited {proc.returncode} without a result: {tail}"}
    raw: dict[str, Any] = json.loads(result_path.read_text())
    if not raw["ok"] or raw["first_record_at"] is None:
        return {"status": "n/a", "reason": f"peer wrote {raw['rows']} of {records} rows before stopping"}
    return {
        "system": "quixstreams",
        "version": QUIX_VERSION,
        "guarantee": "at-least-once",
        "commit_interval_s": commit_interval,
        **file_sink_row(raw, records, value_bytes),
        "launch_to_done_s": raw["last_write_at"] - started,
    }
