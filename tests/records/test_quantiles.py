"""The one percentile and its weighted (bootstrap) form agree to the last bit."""

from __future__ import annotations

import numpy as np
import pytest

from lbtune.records.quantiles import percentile, weighted_percentiles

QS = [0.0, 1.0, 33.3, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]


@pytest.mark.parametrize("q", QS)
def test_unit_weights_equal_percentile_exactly(q: float) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        m = int(rng.integers(1, 300))
        values = np.sort(rng.lognormal(-3.0, 1.0, m))
        got = weighted_percentiles(values, np.ones((m, 1), dtype=np.int32), q)
        assert got[0] == percentile(values, q)  # to the last bit


@pytest.mark.parametrize("q", QS)
def test_weights_equal_percentile_of_the_expanded_sample(q: float) -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        m = int(rng.integers(1, 40))
        values = np.sort(rng.random(m))
        weights = rng.poisson(1.0, size=(m, 6)).astype(np.int32)
        got = weighted_percentiles(values, weights, q)
        for k in range(6):
            expanded = np.repeat(values, weights[:, k])
            if expanded.size == 0:
                assert np.isnan(got[k])
            else:
                assert got[k] == percentile(expanded, q)  # to the last bit


def test_ties_and_no_samples() -> None:
    values = np.array([1.0, 1.0, 2.0, 5.0])
    w = np.array([[0, 2], [0, 0], [0, 1], [0, 3]], dtype=np.int32)
    got = weighted_percentiles(values, w, 50.0)
    assert np.isnan(got[0]) and got[1] == percentile([1.0, 1.0, 2.0, 5.0, 5.0, 5.0], 50.0)
    assert np.isnan(weighted_percentiles(np.empty(0), np.empty((0, 3), np.int32), 99.0)).all()
