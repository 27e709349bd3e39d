"""The raw baseline's run: ``bench/peers/raw.py`` in its own process (its CPU and memory are its own)
over the data set, its result as a throughput row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench.data import TOPIC
from bench.ingest_runs import REPO, Context
from bench.stats import file_sink_row
from ingest_dev.process import run_process


def run_raw(
    ctx: Context, data_ends: dict[int, int], records: int, value_bytes: int, batch: int, timeout: float, run: int = 1
) -> dict[str, Any]:
    """The raw baseline in its own process (its CPU and memory are its own); each run writes
    into its own directory."""
    result_path = ctx.work / f"raw-result-{run}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    with (ctx.work / "logs" / f"raw-{run}.log").open("wb") as out:
        proc = run_process(
            [
                sys.executable,
                "-m",
                "bench.peers.raw",
                "--bootstrap",
                ctx.bootstrap,
                "--topic",
                TOPIC,
                "--ends",
                json.dumps(data_ends),
                "--out",
                str(ctx.work / f"raw-{run}"),
                "--batch",
                str(batch),
                "--timeout",
                str(timeout),
                "--result",
                str(result_path),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout + 60,
            check=False,
        )
    if proc.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"raw baseline failed ({proc.returncode}): see {ctx.work / 'logs' / f'raw-{run}.log'}")
    return {"system": "raw", **file_sink_row(json.loads(result_path.read_text()), records, value_bytes)}
