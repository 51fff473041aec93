"""How a device chooses the jobs it runs in place on pinned host memory
(``backends/in_place.py``): the choice from its timings, and the timing itself."""

from __future__ import annotations

import math
from collections.abc import Callable

from erlcuda.backends.in_place import (
    IN_PLACE_MAX,
    IN_PLACE_SIZES,
    SLOWER,
    InPlaceTiming,
    choose_in_place_max,
    time_both,
)


def timings(*ratios: float) -> list[InPlaceTiming]:
    """One timing a size of ``IN_PLACE_SIZES``: in place at ``ratio`` times the copies."""
    return [InPlaceTiming(n, 1e-4, 1e-4 * r)
            for n, r in zip(IN_PLACE_SIZES, ratios, strict=True)]


def test_in_place_faster_at_every_size_runs_up_to_the_most() -> None:
    assert choose_in_place_max(timings(0.5, 0.6, 0.8, 0.95)) == IN_PLACE_MAX


def test_in_place_stops_before_the_first_size_where_it_was_clearly_slower() -> None:
    assert choose_in_place_max(timings(0.5, 0.7, 1.5, 0.9)) == IN_PLACE_SIZES[1]
    assert choose_in_place_max(timings(0.5, 0.7, 0.9, 2.0)) == IN_PLACE_SIZES[2]


def test_slower_at_the_smallest_size_means_copies_always() -> None:
    assert choose_in_place_max(timings(1.5, 0.5, 0.5, 0.5)) == 0


def test_about_as_fast_counts_as_not_slower() -> None:
    """Within ``SLOWER`` of the copies, a noisy start does not take the gain away."""
    assert choose_in_place_max(timings(1.0, SLOWER * 0.99, 1.05, 1.0)) == IN_PLACE_MAX
    assert choose_in_place_max(timings(1.0, SLOWER * 1.01, 1.0, 1.0)) == IN_PLACE_SIZES[0]


def test_a_size_whose_sums_were_wrong_ends_the_range() -> None:
    """A size where the kernel in place did not compute what the copies did is timed as
    infinitely slow (``CudaDevice._time_in_place``)."""
    assert choose_in_place_max(timings(0.5, math.inf, 0.5, 0.5)) == IN_PLACE_SIZES[0]


def test_timings_in_any_order_and_none_at_all() -> None:
    assert choose_in_place_max(list(reversed(timings(0.5, 0.5, 3.0, 0.5)))) == IN_PLACE_SIZES[1]
    assert choose_in_place_max([]) == 0


def test_both_ways_called_in_turn_after_an_untimed_call_each_and_medians_taken() -> None:
    calls: list[str] = []
    now = [0.0]
    cost = {"copies": iter([100.0, 3.0, 1.0, 2.0]), "in_place": iter([100.0, 5.0, 9.0, 4.0])}

    def way(name: str) -> Callable[[], None]:
        def call() -> None:
            calls.append(name)
            now[0] += next(cost[name])
        return call

    copies_s, in_place_s = time_both(way("copies"), way("in_place"), rounds=3,
                                     clock=lambda: now[0])
    assert calls == ["copies", "in_place"] * 4
    assert (copies_s, in_place_s) == (2.0, 5.0)  # the first calls (100) not among them
