"""Paired-round verdicts: "A vs B" from runs of the same rounds, with a bootstrap interval.

Every comparison lbtune prints (the study's confirmation and before/after table, the
rollout's verification, ``benchmarks/headline.py``) is built here, from **rounds**: in
each round every arm is run once, interleaved (``A B1 B2``), on the same traffic (the
same seed), so that drift of the cluster between rounds hits every arm alike. Only
rounds in which every compared arm was measured are used.

An arm's figures pool the requests of its runs over those rounds; every percentile is
:func:`lbtune.records.quantiles.percentile` (the one estimator). The interval is a
two-level bootstrap that keeps the pairing: each replicate draws the rounds with
replacement (the same rounds for every arm), then the requests within each drawn run
(independently per arm). Run-to-run variance is carried by the first level, request
noise by the second. With a single round only the second level is left.

:func:`tail_quantile` is the rule for which tail a pooled sample supports: P99 needs
:data:`~lbtune.records.quantiles.MIN_SAMPLES` (100) samples, else P95 (20), P90 (10),
P50 (2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from lbtune.records.quantiles import MIN_SAMPLES, PERCENTILES, percentile

R = TypeVar("R")
Rng = np.random.Generator
FloatArray = np.ndarray[tuple[int], np.dtype[np.float64]]
Stat = Callable[[Sequence[R]], Sequence[float]]
"""The figures of one arm's runs pooled (a fixed-length vector; NaN where undefined)."""
Resample = Callable[[R, Rng], R]
"""One run with its requests drawn with replacement."""

TAIL_QUANTILES: tuple[float, ...] = (99.0, 95.0, 90.0, 50.0)
_NAMES = {q: name for name, q in PERCENTILES}


def tail_quantile(n: int) -> float:
    """The highest of :data:`TAIL_QUANTILES` that ``n`` samples support (50 below that)."""
    for q in TAIL_QUANTILES:
        if n >= MIN_SAMPLES[_NAMES[q]]:
            return q
    return 50.0


def finite_percentile(values: FloatArray, q: float) -> float:
    """:func:`percentile` of the finite values (NaN marks a request without the figure)."""
    x = values[np.isfinite(values)]
    return percentile(x, q) if x.size else math.nan


def interval(draws: FloatArray, level: float) -> tuple[float, float]:
    """The percentile-method interval of the finite bootstrap draws (NaN if none)."""
    ok = draws[np.isfinite(draws)]
    if ok.size == 0:
        return math.nan, math.nan
    alpha = (1 - level) / 2 * 100
    return percentile(ok, alpha), percentile(ok, 100 - alpha)


@dataclass(frozen=True, eq=False)
class Draws(Generic[R]):
    """Point figures and bootstrap replicates of every arm.

    ``point[a, k]`` is figure ``k`` of arm ``a`` over all its runs; ``draws[b, a, k]``
    the same in replicate ``b``.
    """

    point: np.ndarray[tuple[int, int], np.dtype[np.float64]]
    draws: np.ndarray[tuple[int, int, int], np.dtype[np.float64]]
    rounds: int

    def diff(self, a: int, b: int, k: int, level: float = 0.95) -> tuple[float, float, float]:
        """``(point, low, high)`` of figure ``k`` of arm ``a`` minus arm ``b``."""
        lo, hi = interval(self.draws[:, a, k] - self.draws[:, b, k], level)
        return float(self.point[a, k] - self.point[b, k]), lo, hi

    def ratio(self, a: int, b: int, k: int, level: float = 0.95) -> tuple[float, float, float]:
        """``(point, low, high)`` of figure ``k`` of arm ``a`` over arm ``b``; NaN if b is 0."""
        den = float(self.point[b, k])
        num = float(self.point[a, k])
        if not den or not math.isfinite(den) or not math.isfinite(num):
            return math.nan, math.nan, math.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = interval(self.draws[:, a, k] / self.draws[:, b, k], level)
        return num / den, lo, hi

    def spread(self, a: int, k: int, level: float = 0.95) -> tuple[float, float]:
        """The interval of figure ``k`` of arm ``a`` alone."""
        return interval(self.draws[:, a, k], level)


def paired_draws(
    rounds: Sequence[Sequence[R]],
    stat: Stat[R],
    resample: Resample[R],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> Draws[R]:
    """Bootstrap of every arm's pooled figures over paired rounds; see the module docstring.

    ``rounds[i][a]`` is arm ``a``'s run in round ``i``; every round has every arm.
    """
    if not rounds:
        raise ValueError("no round in which every arm was measured")
    n_arms = len(rounds[0])
    if any(len(r) != n_arms for r in rounds):
        raise ValueError("every round must hold one run of every arm")
    arms = [[r[a] for r in rounds] for a in range(n_arms)]
    point = np.array([np.asarray(stat(runs), dtype=float) for runs in arms])
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, n_arms, point.shape[1]))
    n = len(rounds)
    for b in range(n_boot):
        picks = rng.integers(0, n, size=n)  # the same rounds for every arm: the pairing
        for a in range(n_arms):
            out[b, a] = stat([resample(arms[a][int(i)], rng) for i in picks])
    return Draws(point, out, n)


def independent_draws(
    arms: Sequence[Sequence[R]],
    stat: Stat[R],
    resample: Resample[R],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> Draws[R]:
    """The same bootstrap for arms whose runs were *not* taken in shared rounds.

    Used only where no pairing exists: the rollout's verification run against the
    baseline's confirmation runs (the baseline cannot run while the winner is live).
    """
    if not arms or any(not runs for runs in arms):
        raise ValueError("every arm needs at least one run")
    point = np.array([np.asarray(stat(runs), dtype=float) for runs in arms])
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(arms), point.shape[1]))
    for b in range(n_boot):
        for a, runs in enumerate(arms):
            picks = rng.integers(0, len(runs), size=len(runs))
            out[b, a] = stat([resample(runs[int(i)], rng) for i in picks])
    return Draws(point, out, max(len(r) for r in arms))
