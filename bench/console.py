"""What every bench prints while it runs: one timestamped line on stderr (stdout keeps the tables)."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
