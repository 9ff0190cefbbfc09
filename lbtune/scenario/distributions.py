"""Token-length distributions: validated models with an exact inverse CDF.

Every distribution is sampled by inversion, ``value = quantile(u)`` for a
uniform ``u`` from :mod:`lbtune.scenario.draws`, then rounded and clipped to
``[min, max]``. That makes sampling random-access and reproducible, and gives
the exact spec percentiles that ``lbtune scenarios show`` compares against.

Kinds (the ``type`` field):

* ``fixed`` — always ``value``.
* ``uniform`` — integers in ``[min, max]``, both required.
* ``normal`` — ``mean``, ``std``; clipped to ``[min, max]``.
* ``lognormal`` — either ``median`` + ``sigma`` (sigma of the underlying
  normal, i.e. of ``ln(x)``) or ``mean`` + ``std`` of the lengths themselves.
* ``empirical`` — a percentile table ``{percentile: tokens}`` read as a
  piecewise-linear inverse CDF; percentile 0 and 100 default to ``min`` and
  ``max`` when the table does not give them.
"""

from __future__ import annotations

import bisect
import itertools
import math
from statistics import NormalDist
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from lbtune.scenario.limits import MAX_SIGMA, MAX_STD, MAX_TOKENS

_STD_NORMAL = NormalDist()


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int | None = Field(default=None, ge=0, le=MAX_TOKENS, description="Lower clip (tokens).")
    max: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="Upper clip (tokens).")

    @model_validator(mode="after")
    def _check_clip(self) -> Self:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def _raw(self, p: float) -> float:
        raise NotImplementedError

    def quantile(self, p: float) -> float:
        """Length at cumulative probability ``p`` (0..1), clipped, before rounding."""
        x = self._raw(min(max(p, 0.0), 1.0))
        lo = 1 if self.min is None else max(self.min, 1)
        if self.max is not None:
            x = min(x, self.max)
        return max(x, lo)

    def sample(self, u: float) -> int:
        """Integer length for a uniform ``u`` in (0, 1)."""
        lo = 1 if self.min is None else max(self.min, 1)
        v = math.floor(self.quantile(u) + 0.5)
        if self.max is not None:
            v = min(v, self.max)
        return max(v, lo)


class Fixed(_Dist):
    type: Literal["fixed"]
    value: int = Field(ge=1, le=MAX_TOKENS, description="Every request has this many tokens.")

    def _raw(self, p: float) -> float:
        return float(self.value)


class Uniform(_Dist):
    type: Literal["uniform"]

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.min is None or self.max is None:
            raise ValueError("uniform needs both min and max")
        return self

    def _raw(self, p: float) -> float:
        # Integers min..max equally likely: floor(min + p * (max - min + 1)).
        lo, hi = self.min or 0, self.max or 0
        return float(min(math.floor(lo + p * (hi - lo + 1)), hi))


class Normal(_Dist):
    type: Literal["normal"]
    mean: float = Field(gt=0, le=MAX_TOKENS)
    std: float = Field(ge=0, le=MAX_STD)

    def _raw(self, p: float) -> float:
        if self.std == 0:
            return self.mean
        if p <= 0:
            return 0.0
        if p >= 1:
            return math.inf
        return self.mean + self.std * _STD_NORMAL.inv_cdf(p)


class LogNormal(_Dist):
    type: Literal["lognormal"]
    median: float | None = Field(default=None, ge=1e-3, le=MAX_TOKENS, description="exp(mu).")
    sigma: float | None = Field(
        default=None, ge=0, le=MAX_SIGMA, description="Std-dev of ln(length)."
    )
    mean: float | None = Field(
        default=None, ge=1e-3, le=MAX_TOKENS, description="Mean length (with std)."
    )
    std: float | None = Field(
        default=None, ge=0, le=MAX_STD, description="Std-dev of length (with mean)."
    )

    @model_validator(mode="after")
    def _check_params(self) -> Self:
        by_median = self.median is not None and self.sigma is not None
        by_mean = self.mean is not None and self.std is not None
        if by_median == by_mean:
            raise ValueError("give either median and sigma, or mean and std (not both, not one)")
        return self

    def params(self) -> tuple[float, float]:
        """``(mu, sigma)`` of the underlying normal."""
        if self.median is not None and self.sigma is not None:
            return math.log(self.median), self.sigma
        assert self.mean is not None and self.std is not None
        s2 = math.log1p((self.std / self.mean) ** 2)
        return math.log(self.mean) - s2 / 2, math.sqrt(s2)

    def _raw(self, p: float) -> float:
        mu, sigma = self.params()
        if p <= 0:
            return 0.0
        if p >= 1:
            return math.inf if sigma > 0 else math.exp(mu)
        return math.exp(mu + sigma * _STD_NORMAL.inv_cdf(p)) if sigma > 0 else math.exp(mu)


class Empirical(_Dist):
    type: Literal["empirical"]
    percentiles: dict[
        Annotated[float, Field(ge=0, le=100)], Annotated[int, Field(ge=0, le=MAX_TOKENS)]
    ] = Field(
        min_length=1,
        description="{percentile (0-100): tokens}, increasing in both; linear in between.",
    )

    @model_validator(mode="after")
    def _check_table(self) -> Self:
        ps = list(self.percentiles)
        vs = list(self.percentiles.values())
        for p in ps:
            if not 0 <= p <= 100:
                raise ValueError(f"percentile {p:g} is outside 0..100")
        for (p0, v0), (p1, v1) in itertools.pairwise(zip(ps, vs, strict=True)):
            if p1 <= p0:
                raise ValueError(f"percentiles must increase: {p1:g} follows {p0:g}")
            if v1 < v0:
                raise ValueError(f"tokens must not decrease: P{p1:g}={v1} < P{p0:g}={v0}")
        for p, v in zip(ps, vs, strict=True):
            if v < 0:
                raise ValueError(f"P{p:g}: negative length {v}")
        if ps[0] > 0 and self.min is None:
            raise ValueError("the table does not start at percentile 0: add a 0 entry or min")
        if ps[-1] < 100 and self.max is None:
            raise ValueError("the table does not end at percentile 100: add a 100 entry or max")
        if self.min is not None and ps[0] > 0 and self.min > vs[0]:
            raise ValueError(f"min ({self.min}) is above P{ps[0]:g} ({vs[0]})")
        if self.max is not None and ps[-1] < 100 and self.max < vs[-1]:
            raise ValueError(f"max ({self.max}) is below P{ps[-1]:g} ({vs[-1]})")
        return self

    _ps: list[float] = PrivateAttr(default_factory=list)
    _vs: list[float] = PrivateAttr(default_factory=list)

    def _table(self) -> tuple[list[float], list[float]]:
        if self._ps:
            return self._ps, self._vs
        ps = [p / 100 for p in self.percentiles]
        vs = [float(v) for v in self.percentiles.values()]
        if ps[0] > 0:
            ps.insert(0, 0.0)
            vs.insert(0, float(self.min or 0))
        if ps[-1] < 1:
            ps.append(1.0)
            vs.append(float(self.max or vs[-1]))
        self._ps, self._vs = ps, vs
        return ps, vs

    def _raw(self, p: float) -> float:
        ps, vs = self._table()
        k = bisect.bisect_right(ps, p)
        if k <= 0:
            return vs[0]
        if k >= len(ps):
            return vs[-1]
        p0, p1, v0, v1 = ps[k - 1], ps[k], vs[k - 1], vs[k]
        return v0 + (v1 - v0) * (p - p0) / (p1 - p0)


Distribution = Annotated[
    Fixed | Uniform | Normal | LogNormal | Empirical, Field(discriminator="type")
]
"""A token-length distribution (discriminated on ``type``)."""


def mixture_quantile(parts: list[tuple[float, _Dist]], p: float) -> float:
    """Quantile ``p`` of a weighted mixture of distributions (bisection on the CDF)."""
    if len(parts) == 1:
        return parts[0][1].quantile(p)
    total = sum(w for w, _ in parts)

    def cdf(x: float) -> float:
        acc = 0.0
        for w, d in parts:
            lo, hi = 0.0, 1.0
            for _ in range(40):
                mid = (lo + hi) / 2
                if d.quantile(mid) <= x:
                    lo = mid
                else:
                    hi = mid
            acc += w * lo
        return acc / total

    lo_x = min(d.quantile(0.0) for _, d in parts)
    hi_x = max(d.quantile(1 - 1e-9) for _, d in parts)
    for _ in range(40):
        mid = (lo_x + hi_x) / 2
        if cdf(mid) < p:
            lo_x = mid
        else:
            hi_x = mid
    return hi_x
