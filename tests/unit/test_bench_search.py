"""The freshness run's rate search: a ramp, then bisection, answering only rates seen held."""

from __future__ import annotations

import pytest

from bench.freshness.search import Outcome, RateSearch


def drive(search: RateSearch, capacity: float) -> list[float]:
    """Run ``search`` against a system that holds every rate up to ``capacity``; the rates probed."""
    probed: list[float] = []
    for _ in range(100):  # bounded: a search that never ends fails below
        rate = search.next_rate()
        if rate is None:
            return probed
        probed.append(rate)
        search.record(rate, Outcome.PASSED if rate <= capacity else Outcome.FAILED)
    raise AssertionError(f"search did not end: {probed}")


def test_ramps_up_then_bisects_to_the_tolerance() -> None:
    search = RateSearch(start=1000, factor=2, tolerance=0.1, max_probes=20)
    probed = drive(search, capacity=5000)
    assert probed[:4] == [1000, 2000, 4000, 8000]
    best, failure = search.best, search.lowest_failure
    assert best is not None and failure is not None
    assert best <= 5000 < failure <= best * 1.1
    assert best in probed and not search.limited


def test_a_first_failure_searches_downward_and_never_answers_an_unseen_rate() -> None:
    search = RateSearch(start=1000, factor=2, tolerance=0.1, max_probes=20)
    probed = drive(search, capacity=300)
    assert probed[:3] == [1000, 500, 250]
    assert search.best is not None and 250 <= search.best <= 300
    assert search.best in probed


def test_nothing_held_down_to_the_floor_gives_no_answer() -> None:
    search = RateSearch(start=100, factor=2, floor=20, max_probes=20)
    probed = drive(search, capacity=0)
    assert probed == [100, 50, 25, 20]
    assert search.best is None


def test_the_probe_budget_bounds_the_search() -> None:
    search = RateSearch(start=1000, max_probes=3)
    assert drive(search, capacity=1e12) == [1000, 2000, 4000]
    assert search.best == 4000 and search.done
    with pytest.raises(RuntimeError):
        search.record(8000, Outcome.PASSED)


def test_a_producer_shortfall_ends_the_search_with_a_lower_bound() -> None:
    search = RateSearch(start=1000)
    search.record(1000, Outcome.PASSED)
    search.record(2000, Outcome.LIMITED)
    assert search.next_rate() is None
    assert search.best == 2000 and search.limited


@pytest.mark.parametrize("kwargs", [{"start": 0}, {"start": 10, "factor": 1.0}, {"start": 10, "tolerance": 0}])
def test_invalid_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RateSearch(**kwargs)  # type: ignore[arg-type]
