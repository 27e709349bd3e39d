"""Threads given up on that cannot be stopped: a Spark start past its bound, a Spark Connect
call retrying an unreachable server, a role's pass still running after a stop's grace
(ingest.roles.runner). While one is alive the process ends at once (ingest.cli.exit_process):
the interpreter's exit would wait for it, or the Spark Connect client's exit hook would retry
its server for minutes. Each is a daemon thread; nothing it still does is trusted (every
publish, replacement and commit has its own fence)."""

from __future__ import annotations

import threading

_abandoned: list[threading.Thread] = []
_lock = threading.Lock()


def abandon(thread: threading.Thread) -> None:
    with _lock:
        _abandoned.append(thread)


def alive() -> list[threading.Thread]:
    with _lock:
        return [t for t in _abandoned if t.is_alive()]


def any_alive() -> bool:
    return bool(alive())
