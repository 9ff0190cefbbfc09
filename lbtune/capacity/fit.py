"""The attainment curve and the capacity it gives, with a bootstrap CI (pure; numpy).

A probe at offered rate ``r`` judges ``n`` requests, ``k`` of which met the SLO; its
attainment is ``k / n``. Attainment falls as the rate rises, so the curve is fitted as a
**monotone** (non-increasing) step-free function of the rate: the weighted isotonic
regression of the probes' attainments (pool adjacent violators, weights ``n``), points at
the same rate pooled first. The **capacity** is where the fitted curve crosses the target
share, linearly interpolated between the last probed rate at or above the target and the
first below it (:func:`crossing`).

Its CI is the percentile interval of the capacity over **Poisson-bootstrap** replicates,
as :mod:`lbtune.metrics.bootstrap` resamples a run, but by **time block**: a probe's window
is cut into consecutive blocks (:mod:`lbtune.capacity.attainment`) and each block is drawn
``Poisson(1)`` times with all its requests. Requests sent together share the replicas'
queues, so a burst that breaks the SLO breaks it for a block at once; drawing requests one
by one would take them as independent and give a CI too narrow near the capacity, where
such bursts decide (on the twin, two probes with other seeds attained 94 % at 19.8 req/s
and 78 % at 19.3 req/s: the higher rate did better by ten binomial standard errors). A
point without blocks (a hand-made one) is drawn request by request: ``Poisson(met)`` met
and ``Poisson(judged - met)`` missed requests, the same distribution as drawing each
request.

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
    blocks: tuple[tuple[int, int], ...] = ()
    """(met, judged) per consecutive time block of the probe's window, for the block
    bootstrap; empty: requests are resampled one by one."""

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
    """Points at the same rate pooled (counts summed, blocks joined when every one has
    them), sorted by rate; empty ones dropped."""
    by_rate: dict[float, list[Point]] = {}
    for p in points:
        by_rate.setdefault(p.rate, []).append(p)
    out = []
    for rate, ps in sorted(by_rate.items()):
        judged = sum(p.judged for p in ps)
        if judged == 0:
            continue
        blocks = tuple(b for p in ps for b in p.blocks) if all(p.blocks for p in ps) else ()
        out.append(Point(rate, sum(p.met for p in ps), judged, blocks))
    return out


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
    low, high = bootstrap_interval(ps, target, ci)
    i = int(np.nonzero(fitted >= target)[0][-1])
    low = min(low, float(rates[i]))
    high = None if high is None else max(high, float(rates[i + 1]))
    return Estimate(kind, cap, (low, high), curve, cliff, counts)


def bootstrap_interval(
    points: Sequence[Point], target: float, ci: CiOptions
) -> tuple[float, float | None]:
    """The percentile interval of the crossing over Poisson-bootstrap replicates of
    ``points`` (pooled: one per rate, ascending).

    A replicate with no probe meeting the target puts the capacity at 0; one whose every
    probe meets it puts it above the highest rate (``high`` is then None when they exceed
    the upper tail)."""
    rng = np.random.default_rng(ci.seed)
    b = ci.resamples
    rates = np.asarray([p.rate for p in points], dtype=float)
    met_b, judged_b = _replicates(points, b, rng)
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


def _replicates(
    points: Sequence[Point], b: int, rng: np.random.Generator
) -> tuple[np.ndarray[tuple[int, int], np.dtype[np.float64]], ...]:
    """``b`` replicates of every point's (met, judged): each time block drawn ``Poisson(1)``
    times (requests of a block stay together, as a queue makes them alike), or, without
    blocks, each request (``Poisson(met)`` met and ``Poisson(judged - met)`` missed)."""
    met_b = np.empty((b, len(points)))
    judged_b = np.empty((b, len(points)))
    for i, p in enumerate(points):
        if p.blocks:
            counts = np.asarray(p.blocks, dtype=float)  # (blocks, 2)
            w = rng.poisson(1.0, size=(b, counts.shape[0])).astype(float)
            met_b[:, i], judged_b[:, i] = w @ counts[:, 0], w @ counts[:, 1]
        else:
            met_b[:, i] = rng.poisson(p.met, size=b)
            judged_b[:, i] = met_b[:, i] + rng.poisson(p.judged - p.met, size=b)
    return met_b, judged_b


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
