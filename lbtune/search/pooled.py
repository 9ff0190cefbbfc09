"""Figures of several runs of one configuration taken together: their requests pooled
for the percentiles (the one estimator), the rest of their figures averaged."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from lbtune.objective import FIGURES, Figures, ObjectiveSpec, stretch_at, stretches
from lbtune.search.paired import finite_percentile
from lbtune.search.trial import Measurement, Samples

__all__ = [
    "figures_of",
    "finite_or_none",
    "mean_decay",
    "mean_figures",
    "pooled_figures",
    "pooled_stretch",
]


def figures_of(runs: Sequence[Samples], q: float) -> list[float]:
    """``[tail E2E, tail TTFT, P50 TTFT]`` of the runs' requests pooled."""
    e2e = np.concatenate([r.e2e for r in runs]) if runs else np.empty(0)
    ttft = np.concatenate([r.ttft for r in runs]) if runs else np.empty(0)
    return [finite_percentile(e2e, q), finite_percentile(ttft, q), finite_percentile(ttft, 50)]


def pooled_stretch(runs: Sequence[Samples], spec: ObjectiveSpec) -> float:
    """The capacity objective's SLO stretch of the runs' requests (and errors) pooled."""
    assert spec.slo is not None
    each = [stretches(r.ttft, r.tpot, r.e2e, r.errors, spec.slo) for r in runs]
    return stretch_at(np.concatenate(each) if each else np.empty(0), spec.share)


def finite_or_none(x: float) -> float | None:
    """``x``, or None when it is not finite (no figure)."""
    return x if math.isfinite(x) else None


def pooled_figures(ms: Sequence[Measurement]) -> Figures | None:
    """The runs' figures with their requests pooled: P99s and P50 TTFT of all their
    samples, errors over all sent; the rest (rates, goodput, balance, decay) averaged."""
    mean = mean_figures(ms)
    samples = [m.samples for m in ms if m.samples is not None]
    if mean is None or not samples:
        return mean
    e2e, ttft, p50 = figures_of(samples, 99.0)
    sent = sum(s.sent for s in samples)
    return replace(
        mean,
        p99_e2e_s=e2e,
        p99_ttft_s=ttft,
        p50_ttft_s=finite_or_none(p50),
        error_rate=sum(s.errors for s in samples) / sent if sent else mean.error_rate,
        samples=sum(int(s.e2e.size) for s in samples),
        p99_e2e_ci=None,
        p99_ttft_ci=None,
    )


def mean_figures(ms: Sequence[Measurement]) -> Figures | None:
    """The mean of the runs' figures (counts summed; intervals are not averaged: None)."""
    figs = [m.figures for m in ms if m.figures is not None]
    if not figs:
        return None
    out: dict[str, object] = {}
    for k in Figures.__dataclass_fields__:
        vals = [getattr(f, k) for f in figs if getattr(f, k) is not None]
        if not vals or not all(isinstance(v, int | float) for v in vals):
            out[k] = None
        elif k in _COUNTS:
            out[k] = int(sum(vals))
        else:
            out[k] = sum(vals) / len(vals)
    return FIGURES.validate_python(
        {k: v for k, v in out.items() if v is not None or k in _OPTIONAL}
    )


_COUNTS = frozenset({"completed", "samples", "censored"})
_OPTIONAL = frozenset(k for k, f in Figures.__dataclass_fields__.items() if "None" in str(f.type))


def mean_decay(ms: Sequence[Measurement]) -> float:
    """The runs' mean throughput decay (0 without figures)."""
    d = [m.figures.decay for m in ms if m.figures is not None]
    return sum(d) / len(d) if d else 0.0
