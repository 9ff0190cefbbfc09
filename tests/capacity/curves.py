"""Hand-made attainment curves: probes that need no server."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from lbtune.capacity.search import ProbeResult


def logistic(capacity: float, target: float, width: float) -> Callable[[float], float]:
    """A falling attainment curve that crosses ``target`` exactly at ``capacity``."""
    shift = math.log(1 / target - 1)  # logit of the miss share at the capacity

    def att(rate: float) -> float:
        return 1 / (1 + math.exp((rate - capacity) / width + shift))

    return att


class CurveProbe:
    """Binomial draws of ``n`` requests from ``att`` (exact counts when ``rng`` is None)."""

    def __init__(
        self,
        att: Callable[[float], float],
        n: int = 400,
        rng: np.random.Generator | None = None,
        behind_above: float = math.inf,
        source: str = "live",
    ) -> None:
        self.att, self.n, self.rng, self.behind_above = att, n, rng, behind_above
        self.source = source
        self.rates: list[float] = []

    def __call__(self, rate: float) -> ProbeResult:
        self.rates.append(rate)
        p = self.att(rate)
        met = round(p * self.n) if self.rng is None else int(self.rng.binomial(self.n, p))
        behind = ("sending lagged 2.1 s behind schedule",) if rate > self.behind_above else ()
        return ProbeResult(rate, met, self.n, behind=behind, source=self.source)
