"""Bootstrap distributions of a run's figures from its per-request records (pure; numpy).

A run is turned into per-request arrays once (:class:`RunArrays`); every figure is
then a function of one weight per request, so that the point estimate (all weights 1)
and thousands of resamples are the same vectorised computation.

Resampling is the **Poisson bootstrap**: in each resample every request of a run is
drawn ``Poisson(1)`` times, independently. That is resampling the requests within
each run (runs are never mixed), it approximates the classic multinomial bootstrap
for latencies, and unlike the multinomial one it lets *counts* vary too, so rates
(throughput, goodput) get an interval from the same draws. Gaps between chunks (ITL)
follow their request's weight: a request is resampled with all of its gaps.

One sample's tail gets its interval from :func:`percentile_interval` (and a difference
of two samples' percentiles from :func:`percentile_diff_interval`), by the same Poisson
bootstrap and the same percentile (:mod:`lbtune.records.quantiles`); an interval is the
percentile interval of the replicates (:func:`interval`).

Figures use exactly the definitions of :mod:`lbtune.metrics.stats` (latencies over
the successful requests sent in the window, percentiles by linear interpolation,
rates over the successful requests that ended in the window, the error rate over the
judged requests sent in the window), so the point estimates equal ``summary.json``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lbtune.metrics.stats import meets_slo
from lbtune.metrics.summary import Window
from lbtune.records.quantiles import (
    MIN_SAMPLES,
    FloatArray,
    Weights,
    percentile,
    weighted_percentiles,
)
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo

BoolArray = np.ndarray[tuple[int], np.dtype[np.bool_]]
IntArray = np.ndarray[tuple[int], np.dtype[np.int64]]

FIGURE_KEYS: tuple[str, ...] = (
    "ttft_p50",
    "ttft_p99",
    "e2e_p99",
    "itl_p50",
    "requests_per_s",
    "output_tokens_per_s",
    "goodput_per_s",
    "error_rate",
)
_CELLS_PER_CHUNK = 2_000_000
"""Resamples are evaluated in chunks of about this many weight cells (memory bound)."""


@dataclass(frozen=True, eq=False)
class RunArrays:
    """Per-request arrays of one run, or of several runs pooled (:meth:`concat`)."""

    window_s: float
    in_window: BoolArray
    """Sent in the measurement window."""
    ok: BoolArray
    judged: BoolArray
    """Not ``cancelled`` (cut off by the test's end): counts in the error rate."""
    done: BoolArray
    """Successful and ended in the window: counts in throughput."""
    good: BoolArray | None
    """``done`` and within the SLO; ``None`` when the run has no latency SLO."""
    ttft: FloatArray
    e2e: FloatArray
    tokens: FloatArray
    itl: FloatArray
    itl_owner: IntArray
    """Index of the request each ITL gap belongs to."""

    @property
    def size(self) -> int:
        return int(self.ok.size)

    @classmethod
    def from_records(
        cls, records: Sequence[RequestRecord], window: Window, slo: Slo | None = None
    ) -> RunArrays:
        n = len(records)
        sent = np.fromiter((r.sent_at for r in records), float, n)
        ended = np.fromiter((r.ended_at for r in records), float, n)
        ok = np.fromiter((r.outcome == "ok" for r in records), bool, n)
        in_window = (sent >= window.start) & (sent < window.end)
        done = ok & (ended >= window.start) & (ended < window.end)
        good = None
        if slo is not None and (slo.ttft_s is not None or slo.e2e_s is not None):
            good = done & np.fromiter((meets_slo(r, slo) for r in records), bool, n)
        itl: list[float] = []
        owner: list[int] = []
        for i, r in enumerate(records):
            if in_window[i] and ok[i] and len(r.chunk_times) > 1:
                gaps = r.itls
                itl.extend(gaps)
                owner.extend([i] * len(gaps))
        nan = float("nan")
        return cls(
            window_s=window.duration,
            in_window=in_window,
            ok=ok,
            judged=np.fromiter((r.outcome != "cancelled" for r in records), bool, n),
            done=done,
            good=good,
            ttft=np.fromiter((nan if (t := r.ttft) is None else t for r in records), float, n),
            e2e=ended - sent,
            tokens=np.fromiter((r.output_tokens or 0 for r in records), float, n),
            itl=np.asarray(itl, dtype=float),
            itl_owner=np.asarray(owner, dtype=np.int64),
        )

    @staticmethod
    def concat(parts: Sequence[RunArrays]) -> RunArrays:
        """Several runs pooled: figures over all their requests, rates over all windows."""
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0, *(p.size for p in parts[:-1])])
        goods = [p.good for p in parts]
        return RunArrays(
            window_s=sum(p.window_s for p in parts),
            in_window=np.concatenate([p.in_window for p in parts]),
            ok=np.concatenate([p.ok for p in parts]),
            judged=np.concatenate([p.judged for p in parts]),
            done=np.concatenate([p.done for p in parts]),
            good=None if any(g is None for g in goods) else np.concatenate(goods),  # type: ignore[arg-type]
            ttft=np.concatenate([p.ttft for p in parts]),
            e2e=np.concatenate([p.e2e for p in parts]),
            tokens=np.concatenate([p.tokens for p in parts]),
            itl=np.concatenate([p.itl for p in parts]),
            itl_owner=np.concatenate(
                [p.itl_owner + o for p, o in zip(parts, offsets, strict=True)]
            ),
        )


def _rate(num: FloatArray, den: float) -> FloatArray:
    return num / den if den > 0 else np.full(num.shape, np.nan)


def figures(a: RunArrays, weights: Weights) -> dict[str, FloatArray]:
    """Every figure of :data:`FIGURE_KEYS` for each column of ``weights`` (requests × k)."""
    lat = a.in_window & a.ok
    out: dict[str, FloatArray] = {}
    for key, values, mask, q in (
        ("ttft_p50", a.ttft, lat & ~np.isnan(a.ttft), 50.0),
        ("ttft_p99", a.ttft, lat & ~np.isnan(a.ttft), 99.0),
        ("e2e_p99", a.e2e, lat, 99.0),
    ):
        idx = np.flatnonzero(mask)
        order = idx[np.argsort(values[idx], kind="stable")]
        out[key] = weighted_percentiles(values[order], weights[order], q)
    order = np.argsort(a.itl, kind="stable")
    out["itl_p50"] = weighted_percentiles(a.itl[order], weights[a.itl_owner[order]], 50.0)
    done = np.flatnonzero(a.done)
    out["requests_per_s"] = _rate(weights[done].sum(axis=0).astype(float), a.window_s)
    out["output_tokens_per_s"] = _rate(a.tokens[done] @ weights[done], a.window_s)
    if a.good is not None:
        out["goodput_per_s"] = _rate(weights[a.good].sum(axis=0).astype(float), a.window_s)
    judged = a.in_window & a.judged
    n_judged = weights[judged].sum(axis=0).astype(float)
    n_err = weights[judged & ~a.ok].sum(axis=0).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["error_rate"] = np.where(n_judged > 0, n_err / n_judged, np.nan)
    return out


def sample_counts(a: RunArrays) -> dict[str, int]:
    """How many samples each percentile figure of :data:`FIGURE_KEYS` rests on."""
    lat = a.in_window & a.ok
    n_ttft = int((lat & ~np.isnan(a.ttft)).sum())
    return {
        "ttft_p50": n_ttft,
        "ttft_p99": n_ttft,
        "e2e_p99": int(lat.sum()),
        "itl_p50": int(a.itl.size),
    }


def point(a: RunArrays) -> dict[str, float | None]:
    """The figures of the run itself (every request once); ``None`` where undefined.

    A percentile below its minimum sample count (:data:`~lbtune.records.quantiles.MIN_SAMPLES`)
    is ``None``, as in ``summary.json``.
    """
    found = figures(a, np.ones((a.size, 1), dtype=np.int32))
    out: dict[str, float | None] = {k: None for k in FIGURE_KEYS}
    for k, v in found.items():
        out[k] = float(v[0]) if np.isfinite(v[0]) else None
    for k, n in sample_counts(a).items():
        if n < MIN_SAMPLES[k.rsplit("_", 1)[1]]:
            out[k] = None
    return out


def resample(a: RunArrays, n: int, rng: np.random.Generator) -> Mapping[str, FloatArray]:
    """``n`` Poisson-bootstrap replicates of every figure (NaN where a replicate is empty)."""
    width = max(a.size, a.itl.size, 1)
    chunk = max(1, min(n, _CELLS_PER_CHUNK // width))
    parts: dict[str, list[FloatArray]] = {}
    left = n
    while left > 0:
        k = min(chunk, left)
        w = rng.poisson(1.0, size=(a.size, k)).astype(np.int32)
        for key, vals in figures(a, w).items():
            parts.setdefault(key, []).append(vals)
        left -= k
    return {k: np.concatenate(v) for k, v in parts.items()}


# --- one sample's percentile and its interval ------------------------------------------


def interval(draws: Sequence[float] | FloatArray, confidence: float) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates: their ``(1 ∓ confidence) / 2`` quantiles.

    Non-finite replicates (empty resamples) are left out.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(draws, dtype=float)
    x = x[np.isfinite(x)]
    tail = (1 - confidence) / 2 * 100
    return percentile(x, tail), percentile(x, 100 - tail)


def _finite_sorted(values: Sequence[float] | FloatArray) -> FloatArray:
    x = np.asarray(values, dtype=float)
    out: FloatArray = np.sort(x[np.isfinite(x)])
    if out.size == 0:
        raise ValueError("percentile of no samples")
    return out


def percentile_draws(
    values: Sequence[float] | FloatArray, q: float, n_boot: int, rng: np.random.Generator
) -> FloatArray:
    """``n_boot`` Poisson-bootstrap replicates of the q-th percentile (0..100) of ``values``.

    NaNs (e.g. the TTFT of a request that was not streamed) are left out first. A
    replicate that drew no sample at all is NaN.
    """
    x = _finite_sorted(values)
    chunk = max(1, min(n_boot, _CELLS_PER_CHUNK // x.size))
    parts: list[FloatArray] = []
    left = n_boot
    while left > 0:
        k = min(chunk, left)
        w = rng.poisson(1.0, size=(x.size, k)).astype(np.int32)
        parts.append(weighted_percentiles(x, w, q))
        left -= k
    return np.concatenate(parts) if parts else np.empty(0)


def percentile_interval(
    values: Sequence[float] | FloatArray,
    q: float,
    *,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(estimate, low, high)``: the q-th percentile of ``values`` and its bootstrap interval.

    The estimate is :func:`lbtune.records.quantiles.percentile` of the finite values;
    the interval is the ``confidence`` percentile interval of ``n_boot`` Poisson-bootstrap
    replicates (seeded, so the same inputs give the same interval). With few samples a
    P99 is close to the maximum and the interval cannot reach above it: read a narrow
    interval over a small sample as "not supported", see ``docs/metrics.md``.
    """
    x = _finite_sorted(values)
    draws = percentile_draws(x, q, n_boot, np.random.default_rng(seed))
    lo, hi = interval(draws, confidence)
    return percentile(x, q), lo, hi


def percentile_diff_interval(
    current: Sequence[float] | FloatArray,
    reference: Sequence[float] | FloatArray,
    q: float,
    *,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(diff, low, high)`` of percentile(current) − percentile(reference), resampled apart."""
    a, b = _finite_sorted(current), _finite_sorted(reference)
    rng_a, rng_b = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    draws = percentile_draws(a, q, n_boot, rng_a) - percentile_draws(b, q, n_boot, rng_b)
    lo, hi = interval(draws, confidence)
    return percentile(a, q) - percentile(b, q), lo, hi
