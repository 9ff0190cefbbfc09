"""percentile_interval / percentile_diff_interval: the estimate, the interval, the seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbtune.metrics.bootstrap import interval, percentile_diff_interval, percentile_interval


def test_estimate_is_the_linear_percentile() -> None:
    # 10, 20, ..., 100: P50 at h = 4.5 -> 55; P90 at h = 8.1 -> 91 (docs/metrics.md).
    values = [10.0 * k for k in range(1, 11)]
    assert percentile_interval(values, 50)[0] == pytest.approx(55.0)
    assert percentile_interval(values, 90)[0] == pytest.approx(91.0)


def test_constant_sample_has_a_zero_width_interval() -> None:
    assert percentile_interval([0.25] * 50, 99) == pytest.approx((0.25, 0.25, 0.25))


def test_nans_are_left_out() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    with_nan = [1.0, math.nan, 2.0, 3.0, math.nan, 4.0, 5.0]
    assert percentile_interval(with_nan, 50) == percentile_interval(values, 50)


def test_no_samples() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile_interval([math.nan], 99)


def test_interval_matches_an_explicit_poisson_bootstrap() -> None:
    """Same seed, same draws: each replicate is the sample with every value repeated Poisson(1)."""
    rng_values = np.random.default_rng(7)
    values = np.sort(rng_values.exponential(0.2, size=150))
    est, lo, hi = percentile_interval(values, 99, confidence=0.9, n_boot=300, seed=3)
    rng = np.random.default_rng(3)
    w = rng.poisson(1.0, size=(values.size, 300))
    draws = [np.percentile(np.repeat(values, w[:, k]), 99) for k in range(300)]
    assert est == pytest.approx(np.percentile(values, 99))
    assert (lo, hi) == pytest.approx(tuple(np.percentile(draws, [5, 95])))
    assert values.min() <= lo <= est <= hi <= values.max()


def test_interval_is_seeded() -> None:
    values = list(np.random.default_rng(1).exponential(size=200))
    assert percentile_interval(values, 99, seed=5) == percentile_interval(values, 99, seed=5)
    assert percentile_interval(values, 99, seed=5) != percentile_interval(values, 99, seed=6)


def test_diff_interval() -> None:
    base = np.random.default_rng(2).exponential(0.1, size=300)
    diff, lo, hi = percentile_diff_interval(base + 1.0, base, 99, n_boot=500)
    assert diff == pytest.approx(1.0)
    assert lo < 1.0 < hi
    same = percentile_diff_interval(base, base, 50, n_boot=500)
    assert same[0] == 0.0 and same[1] < 0.0 < same[2]


def test_interval_of_draws() -> None:
    # Linear percentiles of 0..100 at 2.5 and 97.5.
    assert interval([float(k) for k in range(101)] + [math.nan], 0.95) == pytest.approx((2.5, 97.5))
    with pytest.raises(ValueError, match="confidence"):
        interval([1.0], 1.0)
