"""What every bench does as a command: one timestamped line on stderr (stdout keeps the tables),
and SIGTERM turned into an orderly exit."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM's default kills at once; as SystemExit it unwinds through every ``finally``, which
    # stops the bench's workers, commands, broker and PostgreSQL.
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _terminate)
