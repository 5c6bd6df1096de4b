"""Chapter 13's shared request trace, and the serving benchmark's interleaved ratios and their intervals."""

from __future__ import annotations

import math
import statistics

import pytest
from longctx import ch08
from longctx.support import measure


def test_the_trace_is_seeded_ordered_and_never_outgrows_the_longest_context():
    trace = ch08.request_trace(500, seed=3, max_tokens=4_096)
    assert trace == ch08.request_trace(500, seed=3, max_tokens=4_096)
    assert trace != ch08.request_trace(500, seed=4, max_tokens=4_096)
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert all(r.prompt >= 1 and r.output >= 1 and r.prompt + r.output <= 4_096 for r in trace)
    assert any(r.prompt + r.output == 4_096 for r in trace)  # the tail is cut, not redrawn


def test_the_trace_has_the_medians_and_the_rate_it_was_asked_for():
    trace = ch08.request_trace(4_000, seed=0, rate=8.0, prompt_median=1_000, output_median=100,
                               max_tokens=1_000_000)
    assert statistics.median(r.prompt for r in trace) == pytest.approx(1_000, rel=0.08)
    assert statistics.median(r.output for r in trace) == pytest.approx(100, rel=0.08)
    assert len(trace) / trace[-1].arrival == pytest.approx(8.0, rel=0.08)  # a Poisson stream's rate
    spread = statistics.pstdev(math.log(r.prompt) for r in trace)
    assert spread == pytest.approx(1.0, rel=0.08)  # prompt_sigma's default


def test_zero_spread_gives_every_request_the_median():
    trace = ch08.request_trace(20, prompt_sigma=0, output_sigma=0, prompt_median=300, output_median=7)
    assert {(r.prompt, r.output) for r in trace} == {(300, 7)}


@pytest.mark.parametrize(("count", "low", "high", "covered"), [
    (7, 1, 7, 1 - 2 / 2**7),  # too few values for a narrower interval: the whole range
    (20, 6, 15, 1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2**20),
    (3, 1, 3, 0.75),  # fewer than six values cover less than 95 %, and say so
])
def test_the_median_interval_is_the_widest_pair_of_order_statistics_that_covers_95_percent(count, low, high,
                                                                                       covered):
    values = list(range(count, 0, -1))  # unsorted on purpose: 1 .. count
    middle, lower, upper, coverage = measure.median_interval(values)
    assert middle == statistics.median(values)
    assert (lower, upper) == (low, high)
    assert coverage == pytest.approx(covered)
    if count >= 6:
        assert coverage >= 0.95
    with pytest.raises(ValueError, match="values"):
        measure.median_interval([])


def test_interleaved_rounds_time_every_function_once_a_round_in_a_rotating_order():
    order = []

    def named(name):
        return lambda: order.append(name)

    seconds = measure.interleaved({"a": named("a"), "b": named("b"), "c": named("c")}, rounds=3,
                                  min_run_time=1e-4)
    assert {len(times) for times in seconds.values()} == {3}
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]  # each timing, once
    assert "".join(runs) == "abc" + "abc" + "bca" + "cab"  # the warm-up, then rounds that rotate
    ratio = measure.ratio({"x": [2.0, 4.0, 6.0], "y": [1.0, 1.0, 2.0]}, "x", "y")
    assert (ratio["ratio"], ratio["low"], ratio["high"], ratio["rounds"]) == (3.0, 2.0, 4.0, 3)
