"""Every retry and wait schedule of the worker, and the clock they run on.

A :class:`Backoff` says how long to wait before the n-th retry: exponential (capped), linear,
fixed, or an explicit list of steps. It never gives up by itself: the caller decides when to
stop (a deadline, a kill switch, an attempt count), so a call a worker must see through an
outage (registering a build, publishing a split) is retried until it succeeds or the splits
it serves are killed.

Time comes from a :class:`Clock` (``monotonic`` and ``sleep``), injected: tests pass a fake
one (tests/fakes.py ``FakeClock``) instead of sleeping through a schedule. Code that waits
where it is calls :meth:`Backoff.sleep` (its clock); the consume loop, which never sleeps,
reads its own clock (``LoopContext.clock``) and takes only the delays.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's monotonic clock; ``sleep`` blocks the calling thread."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()


class Growth(enum.Enum):
    """How the delay grows from one retry to the next (``steps``, when given, replace it)."""

    EXPONENTIAL = "exponential"  # initial, initial * multiplier, initial * multiplier**2, ...
    LINEAR = "linear"  # initial, 2 * initial, 3 * initial, ...
    FIXED = "fixed"  # initial every time


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.2
    max_s: float = 10.0
    growth: Growth = Growth.EXPONENTIAL
    multiplier: float = 2.0
    # An explicit schedule: the n-th delay is steps[n], the last one repeated (growth ignored).
    steps: tuple[float, ...] = ()
    clock: Clock = SYSTEM_CLOCK

    @classmethod
    def fixed(cls, seconds: float) -> Backoff:
        return cls(seconds, seconds, Growth.FIXED)

    @classmethod
    def linear(cls, step_s: float, max_s: float = math.inf) -> Backoff:
        return cls(step_s, max_s, Growth.LINEAR)

    @classmethod
    def stepped(cls, *steps: float) -> Backoff:
        if not steps:
            raise ValueError("a stepped backoff needs at least one step")
        return cls(steps[0], max(steps), steps=steps)

    def on(self, clock: Clock) -> Backoff:
        """The same schedule, waited for on ``clock``."""
        return replace(self, clock=clock)

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0: the first retry), at most ``max_s``."""
        if self.steps:
            return self.steps[min(retry, len(self.steps) - 1)]
        if self.growth is Growth.FIXED:
            return min(self.initial_s, self.max_s)
        if self.growth is Growth.LINEAR:
            return min(self.initial_s * (retry + 1), self.max_s)
        # Stops multiplying once capped (no float overflow however long the outage).
        delay = self.initial_s
        for _ in range(retry):
            if delay >= self.max_s:
                break
            delay *= self.multiplier
        return min(delay, self.max_s)

    def delays(self) -> Iterator[float]:
        """The delay before each retry, without end (the caller decides when to stop)."""
        retry = 0
        while True:
            yield self.delay(retry)
            retry += 1

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)

    def sleep_unless(self, seconds: float, stop: Callable[[], bool], *, poll_s: float = 0.05) -> bool:
        """Sleep ``seconds`` on the clock, waking every ``poll_s`` to ask ``stop``; True if
        ``stop`` answered True before the time was up."""
        end = self.clock.monotonic() + seconds
        while (remaining := end - self.clock.monotonic()) > 0:
            if stop():
                return True
            self.clock.sleep(min(remaining, poll_s))
        return False


# Metastore calls retried through an outage: 0.2, 0.4, 0.8, ... 10 s. Frozen, so one instance
# serves as every default.
METASTORE_BACKOFF = Backoff()
