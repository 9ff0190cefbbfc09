"""The monotone fit, the crossing, cliffs, and the CI's coverage on a simulated curve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbtune.capacity.fit import (
    CiOptions,
    Point,
    Spread,
    between_runs,
    bootstrap_interval,
    crossing,
    estimate,
    find_cliff,
    isotonic_decreasing,
    pooled,
    wilson,
)
from tests.capacity.curves import logistic


def test_isotonic_pools_adjacent_violators_by_weight() -> None:
    v = np.array([1.0, 0.8, 0.9, 0.2])
    w = np.array([1.0, 1.0, 3.0, 1.0])
    # 0.8 (w 1) and 0.9 (w 3) violate: pooled to (0.8 + 2.7) / 4 = 0.875.
    assert isotonic_decreasing(v, w).tolist() == [1.0, 0.875, 0.875, 0.2]
    assert isotonic_decreasing(np.array([0.5, 0.7]), np.ones(2)).tolist() == [0.6, 0.6]
    with pytest.raises(ValueError):
        isotonic_decreasing(v, np.array([1.0, 0.0, 1.0, 1.0]))


def test_crossing_interpolates_between_the_probes_either_side() -> None:
    rates = np.array([1.0, 2.0, 4.0])
    # 0.995 at 2 and 0.975 at 4: 0.99 is a quarter of the way, at 2.5.
    assert crossing(rates, np.array([1.0, 0.995, 0.975]), 0.99) == ("bracketed", 2.5)
    assert crossing(rates, np.array([1.0, 0.999, 0.995]), 0.99) == ("above", 4.0)
    assert crossing(rates, np.array([0.9, 0.8, 0.7]), 0.99) == ("below", None)


def test_points_at_one_rate_are_pooled() -> None:
    ps = pooled([Point(2.0, 90, 100), Point(1.0, 10, 10), Point(2.0, 100, 100), Point(3, 0, 0)])
    assert ps == [Point(1.0, 10, 10), Point(2.0, 190, 200, runs=2)]  # two runs: two seeds


def test_a_cliff_is_a_collapse_within_one_step_only() -> None:
    steep = [Point(8.0, 995, 1000), Point(9.0, 100, 1000)]
    assert find_cliff(steep, 0.99) is not None
    far = [Point(4.0, 995, 1000), Point(9.0, 100, 1000)]  # 125 % apart: not one step
    assert find_cliff(far, 0.99) is None
    gentle = [Point(8.0, 995, 1000), Point(9.0, 900, 1000)]
    assert find_cliff(gentle, 0.99) is None


def test_a_cliff_widens_the_ci_to_the_pair() -> None:
    points = [Point(4.0, 1000, 1000), Point(8.0, 998, 1000), Point(9.0, 100, 1000)]
    est = estimate(points, 0.99)
    assert est.cliff is not None and est.kind == "bracketed"
    assert est.ci is not None and est.ci[0] <= 8.0 and est.ci[1] is not None
    assert est.ci[1] >= 9.0


def test_wilson_interval_holds_the_share() -> None:
    lo, hi = wilson(95, 100, 0.9)
    assert lo < 0.95 < hi and lo > 0.88 and hi < 0.99
    assert wilson(0, 0) == (0.0, 1.0)


def test_bootstrap_interval_covers_the_crossing_about_as_often_as_it_claims() -> None:
    """Coverage on a simulated curve: the 90 % bootstrap interval of the interpolated
    crossing, from fixed probes around the capacity of a logistic curve, holds the true
    crossing in 80..98 % of 200 independent sets of probes (measured: 88 %)."""
    true_cap, target = 10.0, 0.95
    att = logistic(true_cap, target, width=1.0)
    rates = [6.0, 8.0, 9.0, 10.0, 11.0, 12.0, 14.0]
    rng = np.random.default_rng(7)
    hits = 0
    for k in range(200):
        points = [Point(r, int(rng.binomial(400, att(r))), 400) for r in rates]
        lo, hi = bootstrap_interval(points, target, CiOptions(0.9, 400, k))
        assert hi is not None
        hits += lo <= true_cap <= hi
    assert 0.80 <= hits / 200 <= 0.98, hits / 200


def _runs_around(
    rng: np.random.Generator, load_sd: float, rates: list[float]
) -> tuple[list[Point], float, float]:
    """Probes of 400 requests at ``rates`` around a logistic curve crossing 0.95 at 10
    req/s, each run behaving like the curve at ``rate * (1 + e)``, ``e`` normal of SD
    ``load_sd`` (its seed's traffic: more or less load), then drawn binomially."""
    true_cap, target = 10.0, 0.95
    att = logistic(true_cap, target, width=1.0)
    points = []
    for r in rates:
        e = rng.normal(0.0, load_sd) if load_sd else 0.0
        points.append(Point(r, int(rng.binomial(400, att(r * (1 + e)))), 400))
    return points, true_cap, target


RATES = [6.0, 8.0, 9.0, 10.0, 11.0, 12.0, 14.0]


def test_between_run_spread_measures_the_runs_scatter_along_the_rate() -> None:
    """On 60 sets of probes: runs shifted by 5 % of load give a root mean spread near
    that (measured 6.3 %: the probes' binomial noise is in it too); without a shift the
    noise alone (3.8 %), under half the variance."""
    rng = np.random.default_rng(3)
    shifted = [between_runs(_runs_around(rng, 0.05, RATES)[0], 0.95).var for _ in range(60)]
    plain = [between_runs(_runs_around(rng, 0.0, RATES)[0], 0.95).var for _ in range(60)]
    assert 0.045 <= float(np.mean(shifted)) ** 0.5 <= 0.085
    assert float(np.mean(plain)) ** 0.5 <= 0.05
    assert float(np.mean(plain)) < float(np.mean(shifted)) / 2


def test_a_probe_the_curve_bent_to_is_a_residual_left_out() -> None:
    """One run at 16 req/s did better than one at 12: fitted with it, the curve bends to
    it (no residual); against the others' curve it sits where 12 req/s did, 25 % of load
    away. Probes that all sit on the plateau say nothing of how runs differ."""
    points = [
        Point(8.0, 396, 400),
        Point(10.0, 392, 400),
        Point(11.0, 393, 400),
        Point(12.0, 330, 400),
        Point(16.0, 340, 400),
    ]
    assert between_runs(points, 0.95).var > 0.1**2
    assert between_runs(points[:3], 0.95) == Spread()  # 98-99 %: the plateau


def test_fewer_than_three_probes_have_no_between_run_spread() -> None:
    assert between_runs([Point(4.0, 390, 400), Point(8.0, 200, 400)], 0.95) == Spread()


def test_the_run_spread_keeps_the_ci_honest_when_runs_differ() -> None:
    """Runs shifted by 5 % of load: the block bootstrap alone covered the true crossing
    in 43 % of 60 sets at 90 % nominal; with the spread, at least 80 % (measured 85 %)."""
    rng = np.random.default_rng(3)
    hits = {"with": 0, "without": 0}
    for k in range(60):
        points, cap, target = _runs_around(rng, 0.05, RATES)
        for name, var in (("with", between_runs(points, target).var), ("without", 0.0)):
            lo, hi = bootstrap_interval(points, target, CiOptions(0.9, 400, k), var)
            hits[name] += lo <= cap <= (math.inf if hi is None else hi)
    assert hits["with"] / 60 >= 0.8, hits
    assert hits["without"] / 60 <= 0.6, hits


def test_the_ci_holds_the_bracket_it_interpolates_in() -> None:
    """Exact counts leave no noise, but a crossing between 4 and 8 req/s is a guess."""
    est = estimate([Point(4.0, 999, 1000), Point(8.0, 40, 1000)], 0.99)
    assert est.ci == (4.0, 8.0)


def test_blocks_that_disagree_widen_the_ci() -> None:
    """The same totals, met evenly over the window or in a burst of misses: the burst's
    blocks disagree, and the block bootstrap's CI is wider."""
    even = [(95, 100)] * 10
    burst = [(100, 100)] * 5 + [(90, 100)] * 5
    lo_rate = Point(8.0, 995, 1000, tuple([(99, 100)] * 5 + [(100, 100)] * 5))

    def width(blocks: list[tuple[int, int]]) -> float:
        mid = Point(10.0, 950, 1000, tuple(blocks))
        hi_rate = Point(12.0, 800, 1000, tuple([(80, 100)] * 10))
        lo, hi = bootstrap_interval([lo_rate, mid, hi_rate], 0.95, CiOptions(seed=1))
        assert hi is not None
        return hi - lo

    assert width(burst) > 1.5 * width(even)


def test_attainment_blocks_pool_by_rate() -> None:
    ps = pooled([Point(2.0, 9, 10, ((9, 10),)), Point(2.0, 5, 10, ((5, 10),))])
    assert ps == [Point(2.0, 14, 20, ((9, 10), (5, 10)), runs=2)]
    mixed = pooled([Point(2.0, 9, 10, ((9, 10),)), Point(2.0, 5, 10)])
    assert mixed[0].blocks == ()  # one without blocks: drawn request by request


def test_a_probe_past_a_cliff_is_not_taken_for_luck() -> None:
    """A live search of a tuned config on mixed (2026-12-06): 97 % at 42.15 req/s, 71 %
    at 44.15 and 70 % at 48.17. Read without 44.15, a straight line from 42.15 to 48.17
    puts it near 90 %, but a cliff may sit anywhere in that step: 44.15 is inside the
    step, no evidence of luck. The spread comes from 40.14, which did worse than 42.15
    (a run 5 % heavier), and the CI neither reaches 0 nor sits at the bracket: other
    searches of the same config put it at 41.9 and 37.3 req/s."""
    points = [
        Point(25.41, 1150, 1161),
        Point(27.48, 1131, 1151),
        Point(29.7, 1272, 1283),
        Point(32.11, 1413, 1441),
        Point(40.14, 1627, 1685),
        Point(42.15, 1873, 1924),
        Point(44.15, 1429, 2020),
        Point(48.17, 1506, 2144),
    ]
    spread = between_runs(points, 0.95)
    assert spread.probes >= 2 and 0.03 < spread.sd < 0.1
    est = estimate(points, 0.95)
    assert est.ci is not None and est.ci[1] is not None
    assert 30.0 < est.ci[0] < 37.3 and 41.9 < est.ci[1] < 48.17


def test_two_runs_at_one_rate_differ_by_luck_whatever_the_step() -> None:
    """The same config's search re-probed 41.83 req/s (2026-12-07): 95.9 % then 70.9 %.
    Each against the other's curve sits in a steep step, but at a rate another run
    measured: the difference is the runs', and the spread says so (it read 0 when the
    step's ends bounded it). The estimate falls below 41.83, its CI holds the bracket."""
    points = [
        Point(27.89, 1214, 1226),
        Point(41.83, 1768, 1843),
        Point(83.66, 288, 3750),
        Point(62.75, 338, 2792),
        Point(52.29, 750, 2268),
        Point(47.06, 712, 2127),
        Point(44.45, 1155, 2035),
        Point(41.83, 1383, 1951),
    ]
    spread = between_runs(points, 0.95)
    assert spread.probes == 2 and spread.sd > 0.05
    assert between_runs(points[:-1], 0.95).var == 0.0  # one run at 41.83: a cliff may be it
    est = estimate(points, 0.95)
    assert est.capacity is not None and 27.89 < est.capacity < 41.83
    assert est.ci is not None and est.ci[0] <= 27.89 and est.ci[1] == 41.83
