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

Blocks capture what varies *within* a probe's window, not what varies **between runs**:
each probe has its own seed, so its traffic is another draw (on ``mixed``, how many long
prompts land in one minute), and on the twin three searches of ``hetero4``/``mixed`` with
other seeds put round robin's capacity at 11.2, 15.6 and 13.2 req/s with block-bootstrap
CIs that did not overlap. A run's luck acts like **more or less load**: a heavier draw is
the same cluster at a higher rate. So the probes' own scatter is measured **along the rate
axis** (:func:`between_runs`): each probe is held against the curve fitted without it, and
its residual is how far (relative to its rate) that curve must be read to meet the probe's
attainment. Near the knee, where the curve is steep, a small shift moves attainment by
points; on the plateau far below it, by a fraction of a point, as runs do (on ``mixed``
a tuned config attained 95 % and 77 % in two runs at 38.8 req/s, and 98-99 % in every run
at 25-32 req/s). The spread ``s^2`` is the mean squared residual, and every bootstrap
replicate moves each probe to ``rate * (1 + e)``, ``e`` normal of that variance, before the
monotone fit. Probes that agree with the others' curve give ``s^2 = 0`` and the block
bootstrap alone. How runs differ can only be seen from two probes or more near the
capacity: :attr:`Spread.probes` says how many measured it, and a search does not call a
CI narrow before there are two (:mod:`lbtune.capacity.search`).

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
    "Spread",
    "between_runs",
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
    runs: int = 1
    """Probes (runs, each with its own seed) pooled into this point."""

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.judged else math.nan


@dataclass(frozen=True)
class Cliff:
    """Attainment collapsing between two adjacent probed rates."""

    below: Point
    above: Point


@dataclass(frozen=True)
class Spread:
    """How much runs differ: the variance of a run's load, as a share of the offered rate
    (a run at rate ``r`` behaves like the curve at ``r * (1 + e)``), and how many probes
    measured it (:func:`between_runs`)."""

    var: float = 0.0
    probes: int = 0

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)


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
    spread: Spread = Spread()
    """How much the probes' runs differ beyond their requests (the CI holds it)."""

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
        runs = sum(p.runs for p in ps if p.judged > 0)
        out.append(Point(rate, sum(p.met for p in ps), judged, blocks, runs))
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
    spread = between_runs(points, target)
    low, high = bootstrap_interval(points, target, ci, spread.var)
    i = int(np.nonzero(fitted >= target)[0][-1])
    low = min(low, float(rates[i]))
    high = None if high is None else max(high, float(rates[i + 1]))
    return Estimate(kind, cap, (low, high), curve, cliff, counts, spread)


def between_runs(
    points: Sequence[Point], target: float, near: float = 0.1, steep: float = 0.25
) -> Spread:
    """How much the probes (each one run with its own seed, unpooled) differ beyond their
    requests, as a shift of load: the variance of ``e``, a run at rate ``r`` behaving like
    the curve at ``r * (1 + e)``.

    A probe is held against the curve fitted **without it** (leave one out: the isotonic
    fit of the others), since a curve fitted with it bends to it: one unlucky probe
    between two others would otherwise look like the curve's shape. Its residual is read
    **along the rate axis**: the rates where the others' curve has the probe's attainment
    (its log-odds interpolated linearly: a logistic fall is a straight line there, so the
    bend of a smooth curve is not taken for luck); 0 when its own rate is among them (a
    flat stretch), else the relative distance to the nearest. What a probe's own requests
    explain is not taken off (taking off its Wilson band at one standard error left the CI
    short on simulated runs: 85 % coverage at 90 % nominal against 92 % without, on one
    set of 60; the noise it leaves in errs wide).

    Between two rates whose values differ by more than ``steep`` the curve's shape is not
    known (a cliff may sit anywhere in that step), so there the step's ends bound it: a
    probe inside the step is no evidence of luck. Not so for a probe at a rate another run
    probed too: that the two differ is luck whatever the curve's shape (two runs of one
    config at 41.8 req/s attained 96 % and 71 %).

    Counted are the probes inside the others' range of rates where the curve or the probe
    is within ``near`` of the target or above, and not both on the plateau above
    ``1 - (1 - target) / 2`` (there a shift of load changes nothing, so agreeing says
    nothing). The variance is the mean squared residual over them; 0 with none."""
    runs = sorted((p for p in points if p.judged > 0), key=lambda p: p.rate)
    plateau = 1 - (1 - target) / 2
    shifts: list[float] = []
    for i, p in enumerate(runs):
        rest = pooled(runs[:i] + runs[i + 1 :])
        if len(rest) < 2 or not rest[0].rate <= p.rate <= rest[-1].rate:
            continue
        rates = np.asarray([q.rate for q in rest], dtype=float)
        judged = np.asarray([q.judged for q in rest], dtype=float)
        fitted = isotonic_decreasing(np.asarray([q.attainment for q in rest]), judged)
        odds = _logit(fitted, 0.5 / judged)
        f = float(_expit(np.interp(p.rate, rates, odds)))
        a = p.attainment
        if max(f, a) < target - near or min(f, a) > plateau:
            continue
        # A step that ends at the probe's own rate was measured there by another run: its
        # drop is the runs' difference, not a cliff of unknown place (no step exemption).
        step = math.inf if bool(np.any(rates == p.rate)) else steep
        first, last = _level_band(rates, fitted, odds, a, step)
        if p.rate < first:
            shifts.append(first / p.rate - 1)
        elif p.rate > last:
            shifts.append(last / p.rate - 1)
        else:
            shifts.append(0.0)
    if not shifts:
        return Spread()
    return Spread(float(np.mean(np.square(shifts))), len(shifts))


def _logit(share: FloatArray, edge: FloatArray | float) -> FloatArray:
    q = np.clip(share, edge, 1 - edge)
    return np.asarray(np.log(q / (1 - q)), dtype=float)


def _expit(x: float) -> float:
    return float(1 / (1 + math.exp(-x)))


def _level_band(
    rates: FloatArray, fitted: FloatArray, odds: FloatArray, level: float, steep: float
) -> tuple[float, float]:
    """Where a non-increasing curve has ``level``: the lowest rate at which it is at or
    below it and the highest at which it is at or above it (the range's far end when it
    never is), its log-odds interpolated linearly between probed rates (a logistic fall is
    a straight line there); in a step steeper than ``steep``, the step's near end."""
    below = np.nonzero(fitted <= level)[0]
    above = np.nonzero(fitted >= level)[0]
    if below.size == 0:
        first = float(rates[-1])
    else:
        j = int(below[0])
        first = float(rates[0]) if j == 0 else _meet(rates, fitted, odds, j, level, steep, j - 1)
    if above.size == 0:
        last = float(rates[0])
    else:
        j = int(above[-1]) + 1
        last = (
            float(rates[-1]) if j == rates.size else _meet(rates, fitted, odds, j, level, steep, j)
        )
    return first, last


def _meet(
    rates: FloatArray,
    fitted: FloatArray,
    odds: FloatArray,
    j: int,
    level: float,
    steep: float,
    step_end: int,
) -> float:
    """The rate between ``rates[j - 1]`` and ``rates[j]`` where the log-odds line meets
    ``level`` (clipped to the two); ``rates[step_end]`` when the segment is a steep step."""
    if fitted[j - 1] - fitted[j] > steep:
        return float(rates[step_end])
    o0, o1 = float(odds[j - 1]), float(odds[j])
    r0, r1 = float(rates[j - 1]), float(rates[j])
    if o0 <= o1:
        return r0
    x = float(_logit(np.asarray([level]), 1e-12)[0])
    t = min(1.0, max(0.0, (o0 - x) / (o0 - o1)))
    return r0 + t * (r1 - r0)


def bootstrap_interval(
    points: Sequence[Point], target: float, ci: CiOptions, shift_var: float = 0.0
) -> tuple[float, float | None]:
    """The percentile interval of the crossing over Poisson-bootstrap replicates of
    ``points``, each moved to ``rate * (1 + e)``, ``e`` normal of variance ``shift_var``
    (a run's load; :func:`between_runs`), then fitted monotone. Without a shift the points
    are pooled by rate; with one, give them one per run, each shifted on its own.

    A replicate with no probe meeting the target puts the capacity at 0; one whose every
    probe meets it puts it above the highest rate (``high`` is then None when they exceed
    the upper tail)."""
    rng = np.random.default_rng(ci.seed)
    b = ci.resamples
    if shift_var <= 0:
        points = pooled(points)
    points = sorted((p for p in points if p.judged > 0), key=lambda p: p.rate)
    rates = np.asarray([p.rate for p in points], dtype=float)
    met_b, judged_b = _replicates(points, b, rng)
    shift = rng.normal(0.0, math.sqrt(max(0.0, shift_var)), size=(b, len(points)))
    draws = np.empty(b)
    for j in range(b):
        keep = judged_b[j] > 0
        w = judged_b[j][keep]
        share = met_b[j][keep] / w
        at = rates[keep]
        if shift_var > 0:
            at = at * np.maximum(0.05, 1 + shift[j][keep])
            order = np.argsort(at, kind="stable")
            at, w, share = at[order], w[order], share[order]
        kind, cap = crossing(at, isotonic_decreasing(share, w), target)
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
