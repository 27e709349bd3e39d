"""The worker's background thread: every metastore call the consumer loop needs outside the
rebalance callbacks (heartbeats and control reads, error reports, a rewind's stored-offset
read, an offset gap's measurement and record, a reset's re-claim, a spec load) runs here, on
a connection of its own, one call at a time.

The bound this gives the polling thread: it never waits for the metastore, except inside a
rebalance callback, where the protocol needs the claim (assign) before positioning and the
release (revoke) before returning, both within the callback's deadline (ingest.consume.rebalance).
``submit`` only queues; results are applied by ``apply_done`` on the polling thread, in the
order the calls finished, so only the polling thread ever changes the loop's state.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class _Task(Generic[T]):
    call: Callable[[], T]
    done: Callable[[T], None] | None
    failed: Callable[[Exception], None] | None
    value: Any = None
    error: Exception | None = None


class Background:
    def __init__(self, name: str = "ingest-background") -> None:
        self._todo: queue.SimpleQueue[_Task[Any] | None] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[_Task[Any]] = queue.SimpleQueue()
        self._queued = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Tasks submitted whose result the polling thread has not applied yet."""
        return self._queued

    def submit(
        self,
        call: Callable[[], T],
        done: Callable[[T], None] | None = None,
        failed: Callable[[Exception], None] | None = None,
    ) -> None:
        """Run ``call`` on the background thread; ``done(value)`` or ``failed(exception)`` run
        later on the polling thread, in ``apply_done``. An exception with no ``failed`` is logged."""
        self._queued += 1
        self._todo.put(_Task(call, done, failed))

    def apply_done(self) -> None:
        """Apply the results of finished calls (polling thread only)."""
        while True:
            try:
                task = self._finished.get_nowait()
            except queue.Empty:
                return
            self._queued -= 1
            if task.error is None:
                if task.done is not None:
                    task.done(task.value)
            elif task.failed is not None:
                task.failed(task.error)
            else:
                log.warning("background_call_failed", error=str(task.error), call=getattr(task.call, "__name__", "?"))

    def wait(self, timeout_s: float) -> bool:
        """Wait (bounded) until every submitted call finished and apply the results; for
        shutdown only. Returns False if some are still running."""
        done = threading.Event()
        self._todo.put(_Task(done.set, None, None))
        finished = done.wait(timeout_s)
        self._queued += 1  # the marker's own result, dropped below
        self.apply_done()
        return finished

    def close(self) -> None:
        self._todo.put(None)

    def _run(self) -> None:
        while (task := self._todo.get()) is not None:
            try:
                task.value = task.call()
            except Exception as exc:  # handed to the polling thread, which decides
                task.error = exc
            self._finished.put(task)
