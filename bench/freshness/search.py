"""The highest rate that passes a probe: a geometric ramp, then bisection (pure logic, no I/O).

A :class:`RateSearch` proposes the next rate to probe and is told whether it passed. It ramps
up from ``start`` by ``factor`` while probes pass; after the first failure it bisects between
the highest pass and the lowest failure until they are within ``tolerance`` of each other (or
the probe budget is spent). A failure of the very first probe bisects downward towards
``floor``. The answer is always a rate that was probed and passed (None if none did): the
search never reports a rate it did not see held.

A probe the load could not be delivered for (the producer fell short of the rate asked) is
``limited``: the system kept up with all the load there was, so that rate is a pass and the
search stops, with the answer marked as a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Outcome(Enum):
    PASSED = "passed"
    FAILED = "failed"
    # Passed at the load delivered, which fell short of the rate asked: the ceiling is not known.
    LIMITED = "limited"


@dataclass(frozen=True)
class Probe:
    rate: float
    outcome: Outcome


@dataclass
class RateSearch:
    start: float
    factor: float = 2.0
    tolerance: float = 0.10  # stop once lowest failure / highest pass <= 1 + tolerance
    max_probes: int = 12
    floor: float = 1.0  # never probe below this rate
    probes: list[Probe] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start <= 0 or self.factor <= 1 or self.tolerance <= 0 or self.max_probes <= 0 or self.floor <= 0:
            raise ValueError("start, tolerance, max_probes and floor must be positive, factor above 1")

    @property
    def best(self) -> float | None:
        """The highest rate that passed (or was limited), None if none has."""
        passed = [p.rate for p in self.probes if p.outcome is not Outcome.FAILED]
        return max(passed) if passed else None

    @property
    def lowest_failure(self) -> float | None:
        failed = [p.rate for p in self.probes if p.outcome is Outcome.FAILED]
        return min(failed) if failed else None

    @property
    def limited(self) -> bool:
        """The answer is a lower bound: the producer could not deliver more load."""
        return any(p.outcome is Outcome.LIMITED for p in self.probes)

    def record(self, rate: float, outcome: Outcome) -> None:
        if self.done:
            raise RuntimeError("the search is done: no probe was asked for")
        self.probes.append(Probe(rate, outcome))

    @property
    def done(self) -> bool:
        return self.next_rate() is None

    def next_rate(self) -> float | None:
        """The rate to probe next, or None when the search is over."""
        if len(self.probes) >= self.max_probes or self.limited:
            return None
        if not self.probes:
            return self.start
        best, failure = self.best, self.lowest_failure
        if failure is None:
            assert best is not None
            return best * self.factor
        if best is None:
            # Nothing has held yet: halve towards the floor; a failure at the floor ends it.
            if failure <= self.floor:
                return None
            return max(self.floor, failure / self.factor)
        if failure <= best * (1 + self.tolerance):
            return None
        # Geometric midpoint: rates span orders of magnitude, the answer's error is relative.
        return float((best * failure) ** 0.5)
