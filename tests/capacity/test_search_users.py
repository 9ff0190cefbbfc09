"""The search over closed-loop users on hand-made attainment curves: whole counts only
(rounded, none probed twice by accident), bracketed and converged to a whole capacity
whose CI is whole too; a CI of one user is as narrow as whole counts go."""

from __future__ import annotations

import math

import numpy as np

from lbtune.capacity.fit import CiOptions
from lbtune.capacity.search import SearchOptions, search
from tests.capacity.curves import CurveProbe, logistic


def over_users(
    attainment: float,
    precision: float,
    start: float = 1.0,
    bracket: tuple[float, float] | None = None,
    ci: CiOptions | None = None,
) -> SearchOptions:
    return SearchOptions(
        attainment=attainment,
        precision=precision,
        start_rate=start,
        bracket=bracket,
        min_rate=1.0,
        max_rate=50_000.0,
        unit="users",
        ci=ci or CiOptions(),
    )


def _whole(levels: list[float]) -> bool:
    return all(float(x).is_integer() for x in levels)


def test_users_probe_whole_counts_and_converge_on_a_whole_capacity() -> None:
    # 7 users attain 99.7 %, 8 users 93 %: the highest count meeting 99 % is 7.
    curve = logistic(7.4, 0.99, width=0.3)
    assert curve(7) >= 0.99 > curve(8)
    probe = CurveProbe(curve, n=5000)
    result = search(probe, over_users(0.99, precision=0.1, start=3))
    est = result.estimate
    # bracket by doubling from 3, then bisect: the middle of 6 and 9 is 7.5, probed as 8;
    # then 7 and 8 again: one run near the capacity cannot tell how much runs differ
    assert probe.rates == [3.0, 6.0, 12.0, 9.0, 8.0, 7.0, 7.0, 8.0]
    assert _whole(probe.rates) and result.estimate.spread.probes >= 2
    assert est.kind == "bracketed" and est.capacity == 7.0
    assert est.ci == (7.0, 8.0)
    # one user is 14 % of 7, wider than the 10 % asked, yet no narrower whole CI exists
    assert est.width() > 0.1
    assert result.converged and result.stopped is None


def test_a_wider_user_count_converges_within_the_precision() -> None:
    curve = logistic(37.4, 0.95, width=1.0)
    probe = CurveProbe(curve, n=5000)
    result = search(probe, over_users(0.95, precision=0.1))
    est = result.estimate
    assert probe.rates[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert _whole(probe.rates) and len(set(probe.rates)) == len(probe.rates)
    assert result.converged and est.width() <= 0.1
    assert est.capacity is not None and est.capacity.is_integer()
    assert est.ci is not None and est.ci[1] is not None
    assert est.ci[0].is_integer() and est.ci[1].is_integer()
    truth = max(n for n in range(1, 64) if curve(n) >= 0.95)
    assert est.ci[0] <= truth <= est.ci[1]


def test_the_twins_bracket_is_rounded_outward_to_whole_users() -> None:
    probe = CurveProbe(logistic(37.4, 0.95, width=1.0), n=5000)
    result = search(probe, over_users(0.95, precision=0.1, bracket=(29.6, 44.4)))
    assert probe.rates[:2] == [29.0, 45.0]
    assert _whole(probe.rates) and len(set(probe.rates)) == len(probe.rates)
    assert result.converged


def test_a_users_slo_no_count_meets_stops_at_one_user() -> None:
    probe = CurveProbe(lambda n: 0.5, n=1000)
    result = search(probe, over_users(0.99, precision=0.1, start=5))
    assert probe.rates == [5.0, 2.0, 1.0]  # 5 / 2 rounds down, to a count not probed
    assert result.estimate.kind == "below"
    assert result.stopped is not None
    assert "not met even at 1 user (attainment 50.0% < 99.0%)" in result.stopped
    assert "no user count this low serves it" in result.stopped


def test_the_generator_falling_behind_is_said_in_users() -> None:
    probe = CurveProbe(logistic(40.0, 0.99, width=2.0), n=2000, behind_above=10.0)
    result = search(probe, over_users(0.99, precision=0.1))
    assert probe.rates == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0]  # redone on purpose, then stop
    assert result.stopped is not None
    assert "fell behind at 16 users on 2 tries" in result.stopped
    assert result.estimate.kind == "above" and result.estimate.capacity == 8.0


def test_noisy_user_searches_stay_whole_and_their_ci_holds_the_truth() -> None:
    """On a noisy curve the search may repeat a count on purpose (more requests at a
    bracket's end); it still never probes a fraction, and its whole CI holds the highest
    count meeting the target in at least 85 % of 30 searches."""
    curve = logistic(23.5, 0.95, width=2.0)
    truth = max(n for n in range(1, 64) if curve(n) >= 0.95)
    hits = 0
    for k in range(30):
        probe = CurveProbe(curve, n=400, rng=np.random.default_rng(300 + k))
        opts = over_users(0.95, 0.2, start=5, ci=CiOptions(resamples=200, seed=k))
        est = search(probe, opts).estimate
        assert _whole(probe.rates), probe.rates
        assert est.ci is not None and est.ci[1] is not None
        assert est.capacity is not None and math.floor(est.capacity) == est.capacity
        hits += est.ci[0] <= truth <= est.ci[1]
    assert hits / 30 >= 0.85, hits / 30
