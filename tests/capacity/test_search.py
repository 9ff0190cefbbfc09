"""The search on hand-made attainment curves: monotone, noisy, with a cliff; the
generator falling behind; a bracket given (the twin's); SLOs no rate meets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lbtune.capacity.fit import CiOptions
from lbtune.capacity.search import ProbeResult, SearchOptions, search
from tests.capacity.curves import CurveProbe, logistic


def test_monotone_curve_converges_on_its_crossing() -> None:
    probe = CurveProbe(logistic(12.0, 0.99, width=0.8), n=5000)
    result = search(probe, SearchOptions(attainment=0.99, precision=0.1))
    est = result.estimate
    assert result.converged and result.stopped is None
    assert est.kind == "bracketed" and est.capacity is not None and est.ci is not None
    assert abs(est.capacity - 12.0) / 12.0 < 0.1
    assert est.ci[1] is not None and est.ci[0] <= 12.0 <= est.ci[1]
    assert est.width() <= 0.1
    # bracketing doubled from 1 req/s: 1, 2, 4, 8, 16 came first
    assert probe.rates[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_noisy_curve_ci_holds_the_truth() -> None:
    rng = np.random.default_rng(3)
    probe = CurveProbe(logistic(30.0, 0.95, width=3.0), n=300, rng=rng)
    result = search(probe, SearchOptions(attainment=0.95, precision=0.15, start_rate=4))
    est = result.estimate
    assert est.ci is not None and est.ci[1] is not None
    assert est.ci[0] <= 30.0 <= est.ci[1]
    assert result.converged or "--max-probes" in (result.stopped or "")
    fitted = [f for _, f in est.curve]
    assert fitted == sorted(fitted, reverse=True)  # the fit is monotone despite the noise


def test_cliff_is_reported_and_bisected_to_the_precision() -> None:
    def att(rate: float) -> float:
        return 0.999 if rate < 7.3 else 0.04

    probe = CurveProbe(att, n=2000)
    result = search(probe, SearchOptions(attainment=0.99, precision=0.05, max_probes=16))
    est = result.estimate
    assert est.cliff is not None
    assert est.cliff.below.rate < 7.3 <= est.cliff.above.rate
    assert est.cliff.above.rate / est.cliff.below.rate - 1 <= 0.05
    assert est.ci is not None and est.ci[1] is not None
    assert est.ci[0] <= 7.3 <= est.ci[1]
    assert result.converged


def test_generator_behind_is_redone_then_stops_the_search() -> None:
    probe = CurveProbe(logistic(40.0, 0.99, width=2.0), n=2000, behind_above=10.0)
    result = search(probe, SearchOptions(attainment=0.99, precision=0.1))
    assert not result.converged
    assert result.stopped is not None and "fell behind at 16 req/s on 2 tries" in result.stopped
    assert probe.rates == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0]  # redone once, then stopped
    assert [p.rate for p in result.used] == [1.0, 2.0, 4.0, 8.0]
    # from the probes measured, the capacity is only known to be at least 8 req/s
    assert result.estimate.kind == "above" and result.estimate.capacity == 8.0


def test_a_probe_behind_once_is_redone_and_the_search_goes_on() -> None:
    inner = CurveProbe(logistic(6.0, 0.99, width=0.5), n=5000)
    seen: set[float] = set()

    def flaky(rate: float) -> ProbeResult:
        r = inner(rate)
        if rate not in seen:
            seen.add(rate)
            if rate == 4.0:
                return replace(r, behind=("a hiccup",))
        return r

    result = search(flaky, SearchOptions(attainment=0.99, precision=0.1))
    assert result.converged
    assert [p.rate for p in result.probes if p.behind] == [4.0]


def test_a_bracket_starts_the_search_near_the_answer() -> None:
    curve = logistic(50.0, 0.99, width=2.0)
    cold = CurveProbe(curve, n=5000)
    search(cold, SearchOptions(attainment=0.99, precision=0.1))
    warm = CurveProbe(curve, n=5000)
    result = search(warm, SearchOptions(attainment=0.99, precision=0.1, bracket=(40.0, 60.0)))
    assert warm.rates[:2] == [40.0, 60.0]
    assert result.converged and len(warm.rates) < len(cold.rates)


def test_a_bracket_that_misses_walks_out_of_it() -> None:
    probe = CurveProbe(logistic(50.0, 0.99, width=2.0), n=5000)
    result = search(probe, SearchOptions(attainment=0.99, precision=0.1, bracket=(5.0, 10.0)))
    assert probe.rates[:3] == [5.0, 10.0, 20.0]
    assert result.converged


def test_an_slo_no_rate_meets_stops_with_the_reason() -> None:
    probe = CurveProbe(lambda r: 0.5, n=1000)
    result = search(probe, SearchOptions(attainment=0.99, min_rate=0.25, start_rate=1.0))
    assert result.estimate.kind == "below" and result.estimate.capacity is None
    assert result.stopped is not None and "not met even at 0.25 req/s" in result.stopped
    assert probe.rates == [1.0, 0.5, 0.25]


def test_an_slo_every_rate_meets_stops_at_the_highest_rate() -> None:
    probe = CurveProbe(lambda r: 1.0, n=100)
    result = search(probe, SearchOptions(attainment=0.99, max_rate=8.0))
    assert result.estimate.kind == "above" and result.estimate.capacity == 8.0
    assert result.stopped is not None and "at least" in result.stopped


def test_searches_ci_covers_the_true_capacity() -> None:
    """Coverage of the whole search on a simulated noisy curve: the printed 90 % CI holds
    the true capacity in at least 85 % of 40 searches, and a converged one is at most
    ``precision`` wide."""
    truth = 20.0
    curve = logistic(truth, 0.95, width=2.0)
    hits = 0
    for k in range(40):
        probe = CurveProbe(curve, n=400, rng=np.random.default_rng(100 + k))
        opts = SearchOptions(0.95, 0.2, start_rate=5, ci=CiOptions(resamples=200, seed=k))
        est = search(probe, opts).estimate
        assert est.ci is not None and est.ci[1] is not None
        hits += est.ci[0] <= truth <= est.ci[1]
    assert hits / 40 >= 0.85, hits / 40


def test_a_ci_reaching_under_the_lowest_level_probes_below_it() -> None:
    """Runs that differ at the lowest level probed (the twin's bracket started there):
    some of its replicates cross below it, so the next probe goes under it rather than
    piling more requests where the runs already disagree."""
    from lbtune.capacity.fit import Point, estimate
    from lbtune.capacity.search import _next_rate

    points = [
        Point(12.5, 493, 500),
        Point(12.5, 465, 500),  # the same rate, another run: 93 %
        Point(13.3, 440, 500),
        Point(15.6, 400, 500),
        Point(18.7, 450, 500),
    ]
    est = estimate(points, 0.95)
    assert est.ci is not None and est.ci[0] < 12.5
    nxt = _next_rate(est, SearchOptions(attainment=0.95, precision=0.15))
    assert nxt < 12.5 and nxt >= 12.5 * 0.9
