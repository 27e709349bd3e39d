"""The retry schedules: each kind's delays, the cap, and waiting on an injected clock."""

from __future__ import annotations

import itertools

from ingest_common.backoff import METASTORE_BACKOFF, Backoff, Growth
from tests.fakes import FakeClock


def first(backoff: Backoff, n: int) -> list[float]:
    return list(itertools.islice(backoff.delays(), n))


def test_exponential_doubles_up_to_the_cap_and_never_ends() -> None:
    assert first(METASTORE_BACKOFF, 8) == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    assert Backoff(0.1, 2.0).delay(10_000) == 2.0  # however long the outage
    assert first(Backoff(1.0, 100.0, multiplier=3.0), 4) == [1.0, 3.0, 9.0, 27.0]


def test_linear_fixed_and_stepped_schedules() -> None:
    assert first(Backoff.linear(1.0), 3) == [1.0, 2.0, 3.0]
    assert first(Backoff.linear(1.0, max_s=2.5), 4) == [1.0, 2.0, 2.5, 2.5]
    assert first(Backoff.fixed(0.5), 3) == [0.5, 0.5, 0.5] and Backoff.fixed(0.5).growth is Growth.FIXED
    assert first(Backoff.stepped(0.5, 1.0, 5.0), 5) == [0.5, 1.0, 5.0, 5.0, 5.0]


def test_sleeping_on_a_fake_clock_moves_it_without_waiting() -> None:
    clock = FakeClock(now=10.0)
    backoff = Backoff.fixed(2.0).on(clock)
    backoff.sleep(backoff.delay(0))
    assert clock.monotonic() == 12.0 and clock.sleeps == [2.0]


def test_sleep_unless_wakes_to_ask_and_stops_early() -> None:
    clock = FakeClock(now=0.0)
    asked: list[float] = []

    def stop() -> bool:
        asked.append(clock.monotonic())
        return len(asked) == 3

    assert Backoff.fixed(1.0).on(clock).sleep_unless(1.0, stop, poll_s=0.25)
    assert asked == [0.0, 0.25, 0.5] and clock.monotonic() == 0.5
    assert not Backoff.fixed(1.0).on(clock).sleep_unless(1.0, lambda: False, poll_s=0.5)
    assert clock.monotonic() == 1.5
