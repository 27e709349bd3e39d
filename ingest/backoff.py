"""Capped exponential backoff for metastore calls a worker must see through an outage
(registering a build, publishing a split): they are retried until they succeed or the
splits they serve are killed, never given up on a timer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.2
    max_s: float = 10.0
    sleep: Callable[[float], None] = time.sleep

    def delays(self) -> Iterator[float]:
        """0.2, 0.4, 0.8, ... up to ``max_s``, without end."""
        delay = self.initial_s
        while True:
            yield delay
            delay = min(delay * 2, self.max_s)


# Frozen, so one instance serves as every default.
METASTORE_BACKOFF = Backoff()
