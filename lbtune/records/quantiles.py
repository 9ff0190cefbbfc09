"""Exact percentiles over samples, and the rule for when a percentile is reported.

One method everywhere: numpy's ``method="linear"`` (Hyndman & Fan type 7, the
numpy and pandas default): for ``n`` sorted samples ``x[0..n-1]`` the q-th
percentile sits at index ``h = (n - 1) * q / 100`` and is
``x[floor h] + (h - floor h) * (x[ceil h] - x[floor h])``. Every percentile lbtune
reports over records goes through :func:`percentile`, or through its weighted form
:func:`weighted_percentiles` (the bootstrap's, :mod:`lbtune.metrics.bootstrap`), which
equals it to the last bit. Nearest rank is not used.

A percentile ``q`` is reported only with at least ``1 / (1 - q/100)`` samples
(:data:`MIN_SAMPLES`: P50 2, P90 10, P95 20, P99 100, P99.9 1000), i.e. when at
least one sample lies beyond it on average; otherwise it is ``None`` and its name
is listed in ``too_few_samples``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    """Exact statistics of one latency over its samples (seconds)."""

    count: int
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    too_few_samples: tuple[str, ...] = ()
    """Percentiles withheld because ``count`` is below their minimum (e.g. ``"p99"``)."""


FloatArray = np.ndarray[tuple[int], np.dtype[np.float64]]
Weights = np.ndarray[tuple[int, int], np.dtype[np.int32]]
"""Sample weights, one column per resample: ``weights[j, k]`` copies of sample ``j``."""

METHOD: Final[Literal["linear"]] = "linear"
"""numpy's name for the one method (Hyndman & Fan type 7)."""

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p999", 99.9),
)
MIN_SAMPLES: dict[str, int] = {"p50": 2, "p90": 10, "p95": 20, "p99": 100, "p999": 1000}


def percentile(values: Sequence[float] | np.ndarray[Any, np.dtype[np.float64]], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; no sample-count rule."""
    if len(values) == 0:
        raise ValueError("percentile of no samples")
    return float(np.percentile(np.asarray(values, dtype=float), q, method=METHOD))


def weighted_percentiles(sorted_values: FloatArray, weights: Weights, q: float) -> FloatArray:
    """:func:`percentile` (q in 0..100) of each column's expanded sample, vectorised.

    ``sorted_values`` is ascending; column ``k`` stands for the sample in which
    ``sorted_values[j]`` appears ``weights[j, k]`` times, and its result equals
    ``percentile(np.repeat(sorted_values, weights[:, k]), q)`` to the last bit (NaN for
    an empty column).
    """
    if sorted_values.size == 0:
        return np.full(weights.shape[1], np.nan)
    cum = np.cumsum(weights, axis=0, dtype=np.int32)
    total = cum[-1]
    h = (total - 1) * (q / 100)
    lo = np.floor(h)
    frac = h - lo
    i_lo = np.minimum((cum <= lo).sum(axis=0), sorted_values.size - 1)
    i_hi = np.minimum((cum <= lo + 1).sum(axis=0), sorted_values.size - 1)
    lo_v, hi_v = sorted_values[i_lo], sorted_values[i_hi]
    diff = hi_v - lo_v
    # numpy's own linear interpolation, term for term, so that the result equals
    # :func:`percentile` to the last bit.
    out = np.where(frac >= 0.5, hi_v - diff * (1 - frac), lo_v + diff * frac)
    return np.where(total > 0, out, np.nan)


def reported_percentile(values: Sequence[float], name: str) -> float | None:
    """The named percentile (``"p99"``), or ``None`` below its minimum sample count."""
    if len(values) < MIN_SAMPLES[name]:
        return None
    return percentile(values, dict(PERCENTILES)[name])


def p99_or_max(values: Sequence[float]) -> tuple[float | None, bool]:
    """P99 for judging an SLO, falling back to the maximum below 100 samples.

    Returns ``(value, is_p99)``. The maximum bounds every percentile from above,
    so judging on it never passes a stage that P99 would fail.
    """
    if not values:
        return None, False
    if len(values) >= MIN_SAMPLES["p99"]:
        return percentile(values, 99.0), True
    return float(max(values)), False


def latency_stats(values: Iterable[float]) -> LatencyStats:
    """Count, mean, min, max and P50..P99.9 of the samples (seconds)."""
    arr = np.sort(np.fromiter(values, dtype=float))
    n = int(arr.size)
    if n == 0:
        return LatencyStats(count=0, too_few_samples=tuple(name for name, _ in PERCENTILES))
    found: dict[str, float | None] = {}
    withheld: list[str] = []
    for name, q in PERCENTILES:
        if n >= MIN_SAMPLES[name]:
            found[name] = percentile(arr, q)
        else:
            found[name] = None
            withheld.append(name)
    return LatencyStats(
        count=n,
        mean=float(arr.mean()),
        min=float(arr[0]),
        max=float(arr[-1]),
        p50=found["p50"],
        p90=found["p90"],
        p95=found["p95"],
        p99=found["p99"],
        p999=found["p999"],
        too_few_samples=tuple(withheld),
    )
