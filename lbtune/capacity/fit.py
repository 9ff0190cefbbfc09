"""The attainment curve and the capacity it gives, with a bootstrap CI (pure; numpy).

A probe at offered rate ``r`` judges ``n`` requests, ``k`` of which met the SLO; its
attainment is ``k / n``. Attainment falls as the rate rises, so the curve is fitted as a
**monotone** (non-increasing) step-free function of the rate: the weighted isotonic
regression of the probes' attainments (pool adjacent violators, weights ``n``), points at
the same rate pooled first. The **capacity** is where the fitted curve crosses the target
share, linearly interpolated between the last probed rate at or above the target and the
first below it (:func:`crossing`).

Its CI is the percentile interval of the capacity over **Poisson-bootstrap** replicates:
each request of each probe is drawn ``Poisson(1)`` times, as :mod:`lbtune.metrics.bootstrap`
resamples a run. A sum of independent ``Poisson(1)`` draws is ``Poisson`` of their count,
so a probe's replicate is ``Poisson(k)`` met and ``Poisson(n - k)`` missed requests: the
same distribution as drawing every request, at the cost of two numbers per probe. Like any
per-request bootstrap it takes requests as independent, which a queue makes them only
approximately (docs/capacity.md).

Between two probed rates the curve is not measured: where it crosses between the last
rate meeting the target and the next one is an interpolation, right for a gentle curve
and wrong for a steep one. So the CI also holds that **bracket** (it is the hull of the
bootstrap interval and the two rates); a search narrows it by bisection (one probe in
the middle) until it is narrower than asked, and a CI narrower than the precision is one
the probes back whatever the curve's shape between them.

A **cliff** is attainment collapsing within one step: two adjacent probed rates at most
``cliff_step`` apart, the lower one meeting the target and the higher one at least
``cliff_drop`` lower (:func:`find_cliff`); it is reported, since running just below a
cliff leaves no margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import NormalDist
from typing import Literal

import numpy as np

from lbtune.records.quantiles import FloatArray, percentile

__all__ = [
    "CiOptions",
    "Cliff",
    "Estimate",
    "Point",
    "bootstrap_interval",
    "crossing",
    "estimate",
    "find_cliff",
    "isotonic_decreasing",
    "pooled",
    "wilson",
]

Kind = Literal["bracketed", "above", "below"]
"""``bracketed``: a probe met the target and a higher one did not; ``above``: every probe
met it (the capacity is at least the highest rate); ``below``: none did."""


@dataclass(frozen=True)
class Point:
    """One probe's (or several pooled probes') attainment at an offered rate."""

    rate: float
    met: int
    judged: int

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.judged else math.nan


@dataclass(frozen=True)
class Cliff:
    """Attainment collapsing between two adjacent probed rates."""

    below: Point
    above: Point


@dataclass(frozen=True)
class Estimate:
    """The capacity of a set of probes: point estimate, CI and the fitted curve."""

    kind: Kind
    capacity: float | None
    """Bracketed: the crossing; above: the highest rate probed (a lower bound); below: None."""
    ci: tuple[float, float | None] | None
    """``(low, high)``; ``high`` None when more than the CI's tail of the replicates put the
    capacity above the highest rate probed. None when not bracketed."""
    curve: tuple[tuple[float, float], ...]
    """The fitted curve: (rate, attainment) at each probed rate."""
    cliff: Cliff | None
    judged: tuple[int, ...] = ()
    """Requests judged at each rate of ``curve`` (probes at one rate pooled)."""

    def width(self) -> float:
        """The CI's width relative to the capacity (inf when open or absent)."""
        if self.ci is None or self.ci[1] is None or not self.capacity:
            return math.inf
        return (self.ci[1] - self.ci[0]) / self.capacity


def pooled(points: Sequence[Point]) -> list[Point]:
    """Points at the same rate pooled (counts summed), sorted by rate; empty ones dropped."""
    by_rate: dict[float, tuple[int, int]] = {}
    for p in points:
        met, judged = by_rate.get(p.rate, (0, 0))
        by_rate[p.rate] = (met + p.met, judged + p.judged)
    return [Point(r, m, n) for r, (m, n) in sorted(by_rate.items()) if n > 0]


def isotonic_decreasing(values: FloatArray, weights: FloatArray) -> FloatArray:
    """The weighted least-squares non-increasing fit (pool adjacent violators); every
    weight must be positive."""
    if np.any(weights <= 0):
        raise ValueError("isotonic fit: every weight must be positive")
    blocks: list[list[float]] = []  # [weighted sum, weight, size]
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, wt, size = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += size
    out = [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]
    return np.asarray(out, dtype=float)


def crossing(rates: FloatArray, fitted: FloatArray, target: float) -> tuple[Kind, float | None]:
    """Where a non-increasing fitted curve over ascending ``rates`` crosses ``target``."""
    meets = np.nonzero(fitted >= target)[0]
    if meets.size == 0:
        return "below", None
    i = int(meets[-1])
    if i == rates.size - 1:
        return "above", float(rates[i])
    f0, f1 = float(fitted[i]), float(fitted[i + 1])
    r0, r1 = float(rates[i]), float(rates[i + 1])
    return "bracketed", r0 + (f0 - target) / (f0 - f1) * (r1 - r0)


def find_cliff(
    points: Sequence[Point], target: float, *, drop: float = 0.5, step: float = 0.25
) -> Cliff | None:
    """The first pair of adjacent probed rates at most ``step`` apart (relative) whose lower
    one meets ``target`` and whose higher one is at least ``drop`` lower."""
    ps = pooled(points)
    for a, b in pairwise(ps):
        close = b.rate <= a.rate * (1 + step)
        if close and a.attainment >= target and a.attainment - b.attainment >= drop:
            return Cliff(a, b)
    return None


@dataclass(frozen=True)
class CiOptions:
    """How the CI is drawn."""

    confidence: float = 0.9
    resamples: int = 1000
    seed: int = 0
    cliff_drop: float = 0.5
    cliff_step: float = 0.25


def estimate(points: Sequence[Point], target: float, ci: CiOptions | None = None) -> Estimate:
    """The capacity at ``target`` of ``points``, its bootstrap CI and the fitted curve."""
    ci = ci or CiOptions()
    ps = pooled(points)
    if not ps:
        return Estimate("below", None, None, (), None)
    counts = tuple(p.judged for p in ps)
    rates = np.asarray([p.rate for p in ps], dtype=float)
    met = np.asarray([p.met for p in ps], dtype=float)
    judged = np.asarray([p.judged for p in ps], dtype=float)
    fitted = isotonic_decreasing(met / judged, judged)
    kind, cap = crossing(rates, fitted, target)
    curve = tuple((float(r), float(f)) for r, f in zip(rates, fitted, strict=True))
    cliff = find_cliff(ps, target, drop=ci.cliff_drop, step=ci.cliff_step)
    if kind != "bracketed" or cap is None:
        return Estimate(kind, cap, None, curve, cliff, counts)
    low, high = bootstrap_interval(rates, met, judged, target, ci)
    i = int(np.nonzero(fitted >= target)[0][-1])
    low = min(low, float(rates[i]))
    high = None if high is None else max(high, float(rates[i + 1]))
    return Estimate(kind, cap, (low, high), curve, cliff, counts)


def bootstrap_interval(
    rates: FloatArray, met: FloatArray, judged: FloatArray, target: float, ci: CiOptions
) -> tuple[float, float | None]:
    """The percentile interval of the crossing over Poisson-bootstrap replicates.

    A replicate with no probe meeting the target puts the capacity at 0; one whose every
    probe meets it puts it above the highest rate (``high`` is then None when they exceed
    the upper tail)."""
    rng = np.random.default_rng(ci.seed)
    b = ci.resamples
    met_b = rng.poisson(met, size=(b, met.size)).astype(float)
    judged_b = met_b + rng.poisson(judged - met, size=(b, met.size))
    draws = np.empty(b)
    for j in range(b):
        keep = judged_b[j] > 0
        w = judged_b[j][keep]
        kind, cap = crossing(rates[keep], isotonic_decreasing(met_b[j][keep] / w, w), target)
        draws[j] = 0.0 if kind == "below" else (math.inf if kind == "above" else float(cap or 0))
    tail = (1 - ci.confidence) / 2
    above = float(np.mean(np.isinf(draws)))
    top = float(rates[-1])
    finite = np.where(np.isinf(draws), top, draws)
    low = percentile(finite, tail * 100)
    high = None if above > tail else percentile(finite, 100 - tail * 100)
    return low, high


def wilson(met: int, judged: int, confidence: float = 0.9) -> tuple[float, float]:
    """The Wilson score interval of a probe's attainment (its points' CI in the report)."""
    if judged == 0:
        return 0.0, 1.0
    z = _z(confidence)
    p = met / judged
    den = 1 + z * z / judged
    mid = (p + z * z / (2 * judged)) / den
    half = z * math.sqrt(p * (1 - p) / judged + z * z / (4 * judged * judged)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _z(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence``."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)
