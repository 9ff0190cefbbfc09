"""Confirmation: is the best candidate really better than where the user started?

After the budget, the best few candidates are re-run against the baseline (the live
configuration), interleaved ``A B1 B2 A B1 B2 ...`` so that drift in the cluster hits
every arm alike, ``K`` times each. For each candidate the composite score of its
pooled runs is compared with the baseline's pooled runs, and a two-level bootstrap
(resample runs, then requests within each run) gives a confidence interval of the
difference. The level is Bonferroni-corrected for the number of candidates
(95 % family-wise). A candidate wins only if the whole interval lies below zero and
it met the constraints in its confirmation runs; otherwise: "no significant
improvement", and nothing is applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lbtune.errors import TrialFailed
from lbtune.objective import Figures, ObjectiveSpec, composite
from lbtune.search.result import Comparison, Confirmation
from lbtune.search.trial import Measurement, Samples, TrialRunner
from lbtune.targets.base import ParamSet

log = logging.getLogger(__name__)

N_BOOT = 1000
Rng = np.random.Generator
Array = np.ndarray[tuple[int], np.dtype[np.float64]]


@dataclass(frozen=True)
class Arm:
    """One configuration under confirmation."""

    label: str
    trial: int
    params: ParamSet


def _p99(x: Array) -> float:
    """P99 of the finite values (NaN marks a request without that figure)."""
    x = x[np.isfinite(x)]
    return float(np.quantile(x, 0.99, method="inverted_cdf")) if x.size else float("nan")


def pooled_score(runs: Sequence[Samples], spec: ObjectiveSpec, decay: float = 0.0) -> float:
    """Composite score of the requests of all ``runs`` taken together."""
    ttft = np.concatenate([r.ttft for r in runs]) if runs else np.empty(0)
    e2e = np.concatenate([r.e2e for r in runs]) if runs else np.empty(0)
    return composite(Figures(p99_e2e_s=_p99(e2e), p99_ttft_s=_p99(ttft), decay=decay), spec)


def _resample(runs: Sequence[Samples], rng: Rng) -> tuple[Array, Array]:
    picks = rng.integers(0, len(runs), size=len(runs))
    ttfts, e2es = [], []
    for i in picks:
        r = runs[int(i)]
        n = r.e2e.size
        idx = rng.integers(0, n, size=n)
        ttfts.append(r.ttft[idx])
        e2es.append(r.e2e[idx])
    return np.concatenate(ttfts), np.concatenate(e2es)


def bootstrap_diff(
    candidate: Sequence[Samples],
    baseline: Sequence[Samples],
    spec: ObjectiveSpec,
    *,
    level: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
    decay: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float, float]:
    """``(diff, ci_low, ci_high)`` of candidate minus baseline composite score.

    Two-level (hierarchical) bootstrap: runs are resampled with replacement, then the
    requests of each picked run; so run-to-run noise counts, not only request noise.
    """
    cand = [r for r in candidate if r.e2e.size]
    base = [r for r in baseline if r.e2e.size]
    if not cand or not base:
        return float("nan"), float("nan"), float("nan")
    diff = pooled_score(cand, spec, decay[0]) - pooled_score(base, spec, decay[1])
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    w, r = spec.weights, spec.refs
    const = w.get("decay", 0.0) * (decay[0] - decay[1]) / r["decay"]
    for b in range(n_boot):
        ct, ce = _resample(cand, rng)
        bt, be = _resample(base, rng)
        boots[b] = (
            w.get("e2e", 0.0) * (_p99(ce) - _p99(be)) / r["e2e"]
            + w.get("ttft", 0.0) * (_p99(ct) - _p99(bt)) / r["ttft"]
            + const
        )
    alpha = 1 - level
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return float(diff), float(lo), float(hi)


def _mean_figures(ms: Sequence[Measurement]) -> Figures | None:
    figs = [m.figures for m in ms if m.figures is not None]
    if not figs:
        return None
    keys = Figures.__dataclass_fields__
    out: dict[str, object] = {}
    for k in keys:
        vals = [getattr(f, k) for f in figs if getattr(f, k) is not None]
        out[k] = None if not vals else (sum(vals) / len(vals))
    out["completed"] = int(sum(f.completed for f in figs))
    return Figures.from_dict(out)


def _measure(
    runner: TrialRunner, arm: Arm, label: str, say: Callable[[str], None]
) -> Measurement | None:
    """One confirmation run; a failed or untrusted run is retried once, then skipped."""
    for attempt in (1, 2):
        try:
            m = runner.run(arm.params, label if attempt == 1 else f"{label}-retry")
        except TrialFailed as exc:
            say(
                f"confirmation run {label} failed ({exc}); "
                + ("retrying" if attempt == 1 else "skipped")
            )
            continue
        if m.samples is not None and not m.stopped:
            return m
        return None
    return None


def confirm(
    runner: TrialRunner,
    baseline: Arm,
    candidates: Sequence[Arm],
    spec: ObjectiveSpec,
    *,
    runs: int,
    seed: int = 0,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = log.info,
) -> Confirmation:
    """Interleaved re-runs and the bootstrap verdict; see the module docstring."""
    if not candidates:
        return Confirmation("baseline is best", baseline.trial)
    arms = [baseline, *candidates]
    results: dict[str, list[Measurement]] = {a.label: [] for a in arms}
    order: list[str] = []
    for k in range(runs):
        for arm in arms:
            if stop is not None and stop.is_set():
                break
            say(f"confirmation {k + 1}/{runs}: {arm.label} (trial {arm.trial})")
            order.append(arm.label)
            m = _measure(runner, arm, f"confirm-{k + 1}-{arm.label}", say)
            if m is not None:
                results[arm.label].append(m)
    base_ms = results[baseline.label]
    base_samples = [m.samples for m in base_ms if m.samples is not None]
    base_decay = _mean_decay(base_ms)
    level = 1 - 0.05 / len(candidates)
    comparisons = []
    for i, arm in enumerate(candidates):
        ms = results[arm.label]
        samples = [m.samples for m in ms if m.samples is not None]
        decay = _mean_decay(ms)
        diff, lo, hi = bootstrap_diff(
            samples, base_samples, spec, level=level, seed=seed + i, decay=(decay, base_decay)
        )
        errs = sum(s.errors for s in samples)
        sent = sum(s.sent for s in samples) or 1
        ok = bool(samples) and errs / sent <= spec.max_error_rate
        base_score = pooled_score(base_samples, spec, base_decay) if base_samples else float("nan")
        comparisons.append(
            Comparison(
                trial=arm.trial,
                params=arm.params,
                runs=tuple(_score(m, spec) for m in ms),
                baseline_runs=tuple(_score(m, spec) for m in base_ms),
                diff=diff,
                ci_low=lo,
                ci_high=hi,
                relative=diff / base_score
                if base_score and np.isfinite(base_score)
                else float("nan"),
                feasible=ok,
                significant=bool(ok and np.isfinite(hi) and hi < 0),
                figures=_mean_figures(ms),
            )
        )
    winners = [c for c in comparisons if c.significant]
    winner = min(winners, key=lambda c: c.diff).trial if winners else None
    return Confirmation(
        verdict="improved" if winner is not None else "no significant improvement",
        baseline_trial=baseline.trial,
        baseline_figures=_mean_figures(base_ms),
        comparisons=tuple(comparisons),
        winner=winner,
        runs_per_arm=runs,
        order=tuple(order),
        baseline_samples=tuple(base_samples),
    )


def _mean_decay(ms: Sequence[Measurement]) -> float:
    d = [m.figures.decay for m in ms if m.figures is not None]
    return sum(d) / len(d) if d else 0.0


def _score(m: Measurement, spec: ObjectiveSpec) -> float:
    return composite(m.figures, spec) if m.figures is not None else float("nan")
