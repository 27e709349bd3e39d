"""``python -m bench.worker_profile``: one worker's CPU per thread and function (bench/profiling/worker.py)."""

from __future__ import annotations

import sys

from bench.profiling.worker import main

if __name__ == "__main__":
    sys.exit(main())
