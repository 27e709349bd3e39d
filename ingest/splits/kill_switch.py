"""A split's kill switch: tripped once (revoke, lost, rewind, reset, shutdown, a failed
predecessor), never reset.

Invariant: publishing holds the switch (:meth:`KillSwitch.hold`) across its commit, so once
:meth:`KillSwitch.trip` returns True no commit of the split can begin; a commit already
running finishes first. ``trip`` waits for it at most ``timeout``: past that the metastore's
serial check is the only fence, which is always sufficient for correctness (a partition whose
switch could not be tripped in time is never repositioned from a stored offset read before
that commit resolved: see ingest.consume.positioning).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ingest.errors import SplitKilled


class KillSwitch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []

    @property
    def reason(self) -> str | None:
        return self._reason

    @property
    def tripped(self) -> bool:
        return self._reason is not None

    def on_trip(self, callback: Callable[[str], None]) -> None:
        """Run ``callback(reason)`` when tripped (at once if already tripped)."""
        run_now = False
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
            else:
                run_now = True
        if run_now:
            callback(self._reason or "")

    def trip(self, reason: str, timeout: float = 5.0) -> bool:
        """Trip the switch. Returns False when a commit in progress did not finish in time."""
        acquired = self._lock.acquire(timeout=timeout)
        try:
            if self._reason is not None:
                return acquired
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
        finally:
            if acquired:
                self._lock.release()
        for callback in callbacks:
            callback(reason)
        return acquired

    def check(self) -> None:
        if self._reason is not None:
            raise SplitKilled(self._reason)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the switch from tripping while the body runs; raise if already tripped."""
        with self._lock:
            if self._reason is not None:
                raise SplitKilled(self._reason)
            yield
