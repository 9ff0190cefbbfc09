"""Confirmation: is the best candidate really better than where the user started?

After the budget, the best few candidates are re-run against the baseline (the live
configuration, always measured afresh: its search run is never used) in **rounds**:
in every round the baseline first, then each candidate, ``A B1 B2 A B1 B2 ...``, on
the same traffic (the study's seed), so that drift of the cluster hits every arm
alike. A round whose baseline run cannot be measured (after one retry) is skipped
whole — its candidates would have nothing to be paired with — and does not count
towards ``runs``. If the baseline has not been measured in :data:`BASELINE_TRIES`
rounds in a row (nor in any before), or by the round cap, :class:`BaselineUnmeasurable`
is raised.

**Enough samples.** At least ``runs`` rounds with a measured baseline; then more, one
at a time, while some arm's pooled requests are fewer than a P99 needs
(:data:`~lbtune.records.quantiles.MIN_SAMPLES`, 100), up to ``max_rounds`` rounds and
``max_s`` seconds of confirmation (a round is started only if it is expected to end in
time). If the cap is hit, every arm is judged on the highest tail its samples support
(:func:`lbtune.search.paired.tail_quantile`) and the note says so:
"P99 from N samples: not enough; reporting P95".

**Verdict.** For each candidate, over the rounds both it and the baseline were
measured in, the composite score of its pooled requests is compared with the
baseline's, and the paired two-level bootstrap of :mod:`lbtune.search.paired` gives
the interval of the difference, Bonferroni-corrected for the number of candidates
(95 % family-wise). A candidate wins only if the whole interval lies below zero and it
met the constraints in its confirmation runs; otherwise: "no significant improvement",
and nothing is applied.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from lbtune.errors import LbtuneError, TrialFailed
from lbtune.objective import Figures, ObjectiveSpec, composite
from lbtune.records.quantiles import MIN_SAMPLES
from lbtune.search.paired import (
    finite_percentile,
    independent_draws,
    paired_draws,
    tail_quantile,
)
from lbtune.search.pooled import figures_of, finite_or_none, mean_decay, pooled_figures
from lbtune.search.result import Comparison, Confirmation, Pooled, RoundRun
from lbtune.search.trial import Measurement, Samples, TrialRunner
from lbtune.targets.base import ParamSet

log = logging.getLogger(__name__)

N_BOOT = 1000
MAX_ROUNDS = 6
"""Default cap on confirmation rounds when the pooled samples are too few for a P99."""
MAX_SECONDS = 900.0
"""Default cap on the wall time of confirmation (15 min)."""
NEED = MIN_SAMPLES["p99"]
"""Pooled samples per arm for a P99 (100)."""
BASELINE_TRIES = 3
"""Rounds in a row (each run retried once) an arm may fail, when no round has measured it
yet, before it is given up: the baseline is then unmeasurable (the study stops with
:class:`BaselineUnmeasurable`), a candidate gets no further rounds (it cannot win)."""


class BaselineUnmeasurable(LbtuneError):
    """The live configuration could not be measured in any confirmation round."""


@dataclass(frozen=True)
class Arm:
    """One configuration under confirmation."""

    label: str
    trial: int | None
    params: ParamSet


# --- figures of pooled runs (the one estimator) -----------------------------------------


def _score(tail_e2e: float, tail_ttft: float, decay: float, spec: ObjectiveSpec) -> float:
    return composite(Figures(p99_e2e_s=tail_e2e, p99_ttft_s=tail_ttft, decay=decay), spec)


def _resample(r: Samples, rng: np.random.Generator) -> Samples:
    idx = rng.integers(0, r.e2e.size, size=r.e2e.size)
    return Samples(r.ttft[idx], r.e2e[idx], r.sent, r.errors)


def _stat(
    spec: ObjectiveSpec, q: float, decay: float
) -> Callable[[Sequence[Samples]], list[float]]:
    def stat(runs: Sequence[Samples]) -> list[float]:
        e2e, ttft, p50 = figures_of(runs, q)
        return [_score(e2e, ttft, decay, spec), e2e, ttft, p50]

    return stat


def pooled_score(
    runs: Sequence[Samples], spec: ObjectiveSpec, decay: float = 0.0, q: float = 99.0
) -> float:
    """Composite score of the requests of all ``runs`` taken together, at tail ``q``."""
    e2e, ttft, _ = figures_of(runs, q)
    return _score(e2e, ttft, decay, spec)


def bootstrap_diff(
    candidate: Sequence[Samples],
    baseline: Sequence[Samples],
    spec: ObjectiveSpec,
    *,
    level: float = 0.95,
    n_boot: int = N_BOOT,
    seed: int = 0,
    decay: tuple[float, float] = (0.0, 0.0),
    paired: bool = False,
    q: float = 99.0,
) -> tuple[float, float, float]:
    """``(diff, ci_low, ci_high)`` of candidate minus baseline composite score.

    ``paired``: ``candidate[i]`` and ``baseline[i]`` ran in the same round (the
    confirmation); else the two sides' runs are resampled independently (the rollout's
    verification run against the baseline's confirmation runs).
    """
    cand = [r for r in candidate if r.e2e.size]
    base = [r for r in baseline if r.e2e.size]
    if not cand or not base:
        return math.nan, math.nan, math.nan
    stat_c, stat_b = _stat(spec, q, decay[0]), _stat(spec, q, decay[1])

    def stat(runs: Sequence[tuple[int, Samples]]) -> list[float]:
        # Arms carry their index so that each side keeps its own (constant) decay.
        arm = runs[0][0]
        return (stat_c if arm == 0 else stat_b)([s for _, s in runs])

    def resample(r: tuple[int, Samples], rng: np.random.Generator) -> tuple[int, Samples]:
        return r[0], _resample(r[1], rng)

    if paired:
        pairs = [
            ((0, c), (1, b))
            for c, b in zip(candidate, baseline, strict=True)
            if c.e2e.size and b.e2e.size
        ]
        if not pairs:
            return math.nan, math.nan, math.nan
        draws = paired_draws(pairs, stat, resample, n_boot=n_boot, seed=seed)
    else:
        arms = [[(0, c) for c in cand], [(1, b) for b in base]]
        draws = independent_draws(arms, stat, resample, n_boot=n_boot, seed=seed)
    return draws.diff(0, 1, 0, level)


# --- running the rounds -------------------------------------------------------------------


def _measure(
    runner: TrialRunner, arm: Arm, label: str, say: Callable[[str], None]
) -> tuple[Measurement | None, str, str]:
    """One confirmation run, a failed or untrusted one retried once: (m, why not, label)."""
    reason = ""
    for attempt in (1, 2):
        used = label if attempt == 1 else f"{label}-retry"
        try:
            m = runner.run(arm.params, used)
        except TrialFailed as exc:
            reason = str(exc)
            say(
                f"confirmation run {label} failed ({exc}); "
                + ("retrying" if attempt == 1 else "skipped")
            )
            continue
        if m.stopped:
            return None, "stopped", used
        if m.samples is None or m.figures is None:
            return None, "not measurable: no samples", used
        return m, "", used
    return None, reason, label


def _run_row(
    k: int, arm: Arm, label: str, m: Measurement | None, reason: str, q: float
) -> RoundRun:
    if m is None or m.samples is None:
        return RoundRun(k, arm.label, arm.trial, label, False, reason or "not measured")
    s = m.samples
    n_ttft = int(np.isfinite(s.ttft).sum())
    window = m.extra.get("window")
    return RoundRun(
        round=k,
        arm=arm.label,
        trial=arm.trial,
        label=label,
        measured=True,
        requests=int(s.e2e.size),
        sent=s.sent,
        errors=s.errors,
        tail_e2e_s=finite_percentile(s.e2e, q) if tail_quantile(s.e2e.size) >= q else None,
        tail_ttft_s=finite_percentile(s.ttft, q) if tail_quantile(n_ttft) >= q else None,
        requests_per_s=None if m.figures is None else m.figures.requests_per_s,
        window=None if not isinstance(window, tuple) else (float(window[0]), float(window[1])),
    )


def _counts(runs: Sequence[Samples]) -> int:
    """The smaller of the pooled E2E and (where any request streamed) TTFT sample counts."""
    e2e = sum(int(r.e2e.size) for r in runs)
    ttft = sum(int(np.isfinite(r.ttft).sum()) for r in runs)
    return min(e2e, ttft) if ttft else e2e


def confirm(
    runner: TrialRunner,
    baseline: Arm,
    candidates: Sequence[Arm],
    spec: ObjectiveSpec,
    *,
    runs: int,
    max_rounds: int = MAX_ROUNDS,
    max_s: float = MAX_SECONDS,
    seed: int = 0,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = log.info,
    clock: Callable[[], float] = time.monotonic,
) -> Confirmation:
    """Interleaved rounds and the paired bootstrap verdict; see the module docstring."""
    if not candidates:
        return Confirmation("baseline is best", baseline.trial, note="no candidate to confirm")
    arms = [baseline, *candidates]
    measured: dict[tuple[int, str], Measurement] = {}
    plan: list[tuple[int, Arm, str, Measurement | None, str]] = []
    order: list[str] = []
    t0 = clock()
    k = 0
    cap_hit = ""
    misses = dict.fromkeys((a.label for a in arms), 0)  # tried and failed, rounds in a row
    dropped: set[str] = set()
    while stop is None or not stop.is_set():
        good = sum(1 for _, label in measured if label == baseline.label)
        n = _smallest_pool([a for a in arms if a.label not in dropped], measured)
        if good >= runs and n >= NEED:
            break
        if good == 0 and misses[baseline.label] >= BASELINE_TRIES:
            break
        per_round = (clock() - t0) / k if k else 0.0
        if k >= max_rounds or (k and clock() - t0 + per_round > max_s):
            cap_hit = (
                f"confirmation stopped at {k} round(s), {clock() - t0:.0f} s "
                f"(cap {max_rounds} rounds, {max_s:.0f} s)"
            )
            break
        if good >= runs:
            say(f"confirmation: {n} pooled samples in the smallest arm, a P99 needs {NEED}")
        k += 1
        _round(runner, k, arms, measured, plan, order, misses, dropped, stop, say)
        if len(dropped) == len(candidates):
            break
    return _verdict(baseline, candidates, spec, measured, plan, k, order, cap_hit, seed, stop, say)


def _round(
    runner: TrialRunner,
    k: int,
    arms: Sequence[Arm],
    measured: dict[tuple[int, str], Measurement],
    plan: list[tuple[int, Arm, str, Measurement | None, str]],
    order: list[str],
    misses: dict[str, int],
    dropped: set[str],
    stop: threading.Event | None,
    say: Callable[[str], None],
) -> None:
    """Round ``k``: every arm once, the baseline first; an arm is skipped when this round's
    baseline failed and dropped once it failed ``BASELINE_TRIES`` rounds in a row without
    ever being measured. ``measured``, ``plan``, ``order``, ``misses`` and ``dropped`` grow."""
    baseline = arms[0]
    for arm in arms:
        if stop is not None and stop.is_set():
            return
        label = f"confirm-{k}-{arm.label}"
        if arm is not baseline and (k, baseline.label) not in measured:
            plan.append((k, arm, label, None, "skipped: the baseline of this round failed"))
            continue
        if arm.label in dropped:
            plan.append((k, arm, label, None, "dropped: not measurable"))
            continue
        say(f"confirmation round {k}: {arm.label} (trial {arm.trial})")
        order.append(arm.label)
        m, why, label = _measure(runner, arm, label, say)
        misses[arm.label] = 0 if m is not None else misses[arm.label] + 1
        if m is not None:
            measured[(k, arm.label)] = m
        elif arm is baseline:
            say(f"round {k}: the baseline could not be measured ({why}); round skipped")
        elif misses[arm.label] >= BASELINE_TRIES and not any(
            label == arm.label for _, label in measured
        ):
            dropped.add(arm.label)
            say(
                f"confirmation: {arm.label} (trial {arm.trial}) not measurable in "
                f"{BASELINE_TRIES} rounds in a row; no further rounds for it"
            )
        plan.append((k, arm, label, m, why))


def _verdict(
    baseline: Arm,
    candidates: Sequence[Arm],
    spec: ObjectiveSpec,
    measured: dict[tuple[int, str], Measurement],
    plan: list[tuple[int, Arm, str, Measurement | None, str]],
    k: int,
    order: list[str],
    cap_hit: str,
    seed: int,
    stop: threading.Event | None,
    say: Callable[[str], None],
) -> Confirmation:
    """The paired bootstrap verdict over ``k`` rounds (Bonferroni over the candidates); a
    BaselineUnmeasurable when no round measured the baseline (unless stopped)."""
    arms = [baseline, *candidates]
    base_ms = [
        measured[(i, baseline.label)] for i in range(1, k + 1) if (i, baseline.label) in measured
    ]
    if not base_ms and not (stop is not None and stop.is_set()):
        reasons = {why for _, a, _, m, why in plan if a is baseline and m is None}
        raise BaselineUnmeasurable(
            f"the live configuration (trial {baseline.trial}) could not be measured in any of "
            f"{k} confirmation round(s) ({'; '.join(sorted(reasons)) or 'no run'}): "
            "no verdict, nothing applied"
        )
    n_min = _smallest_pool(arms, measured)
    q = tail_quantile(n_min)
    note = ""
    if q < 99:
        note = f"P99 from {n_min} samples: not enough; reporting P{q:g}"
        note = f"{cap_hit}: {note}" if cap_hit else note
        say(note)
    rows = tuple(_run_row(i, a, lab, m, why, q) for i, a, lab, m, why in plan)
    rows = tuple(_with_score(r, measured, spec, q) for r in rows)
    level = 1 - 0.05 / len(candidates)
    comparisons = [
        _compare(arm, baseline, measured, k, spec, q, level, seed + i)
        for i, arm in enumerate(candidates)
    ]
    winners = [c for c in comparisons if c.significant]
    winner = min(winners, key=lambda c: c.diff).trial if winners else None
    return Confirmation(
        verdict="improved" if winner is not None else "no significant improvement",
        baseline_trial=baseline.trial,
        baseline_figures=pooled_figures(base_ms),
        comparisons=tuple(comparisons),
        winner=winner,
        runs_per_arm=k,
        order=tuple(order),
        baseline_samples=tuple(m.samples for m in base_ms if m.samples is not None),
        rounds=rows,
        quantile=q,
        note=note,
    )


def _smallest_pool(arms: Sequence[Arm], measured: dict[tuple[int, str], Measurement]) -> int:
    """The smallest per-arm pooled sample count, over rounds the baseline was measured in."""
    base = arms[0].label
    rounds = {i for i, label in measured if label == base}
    counts = []
    for arm in arms:
        runs = [
            m.samples
            for (i, label), m in measured.items()
            if label == arm.label and i in rounds and m.samples is not None
        ]
        counts.append(_counts(runs))
    return min(counts) if counts else 0


def _with_score(
    r: RoundRun, measured: dict[tuple[int, str], Measurement], spec: ObjectiveSpec, q: float
) -> RoundRun:
    m = measured.get((r.round, r.arm))
    if m is None or m.samples is None:
        return r
    decay = m.figures.decay if m.figures is not None else 0.0
    return replace(r, score=pooled_score([m.samples], spec, decay, q))


def _pooled(
    ms: Sequence[Measurement], rounds: tuple[int, ...], spec: ObjectiveSpec, q: float
) -> Pooled:
    samples = [m.samples for m in ms if m.samples is not None]
    e2e, ttft, p50 = figures_of(samples, q)
    rates = [m.figures.requests_per_s for m in ms if m.figures is not None]
    sent = sum(s.sent for s in samples)
    decay = mean_decay(ms)
    return Pooled(
        rounds=rounds,
        requests=sum(int(s.e2e.size) for s in samples),
        ttft_requests=sum(int(np.isfinite(s.ttft).sum()) for s in samples),
        tail_e2e_s=finite_or_none(e2e),
        tail_ttft_s=finite_or_none(ttft),
        p50_ttft_s=finite_or_none(p50),
        requests_per_s=sum(rates) / len(rates) if rates else None,
        error_rate=sum(s.errors for s in samples) / sent if sent else None,
        score=finite_or_none(_score(e2e, ttft, decay, spec)),
    )


def _compare(
    arm: Arm,
    baseline: Arm,
    measured: dict[tuple[int, str], Measurement],
    n_rounds: int,
    spec: ObjectiveSpec,
    q: float,
    level: float,
    seed: int,
) -> Comparison:
    rounds = tuple(
        i
        for i in range(1, n_rounds + 1)
        if (i, arm.label) in measured and (i, baseline.label) in measured
    )
    cand_ms = [measured[(i, arm.label)] for i in rounds]
    base_ms = [measured[(i, baseline.label)] for i in rounds]
    cand_s = [m.samples for m in cand_ms if m.samples is not None]
    base_s = [m.samples for m in base_ms if m.samples is not None]
    decay = (mean_decay(cand_ms), mean_decay(base_ms))
    diff, lo, hi = bootstrap_diff(
        cand_s, base_s, spec, level=level, seed=seed, decay=decay, paired=True, q=q
    )
    cand, base = _pooled(cand_ms, rounds, spec, q), _pooled(base_ms, rounds, spec, q)
    ok = bool(cand_s) and (cand.error_rate or 0.0) <= spec.max_error_rate
    return Comparison(
        trial=arm.trial if arm.trial is not None else -1,
        params=arm.params,
        runs=tuple(pooled_score([s], spec, decay[0], q) for s in cand_s),
        baseline_runs=tuple(pooled_score([s], spec, decay[1], q) for s in base_s),
        diff=diff,
        ci_low=lo,
        ci_high=hi,
        relative=diff / base.score if base.score else math.nan,
        feasible=ok,
        significant=bool(ok and math.isfinite(hi) and hi < 0),
        figures=pooled_figures(cand_ms),
        arm=arm.label,
        rounds=rounds,
        candidate=cand,
        baseline=base,
        baseline_figures=pooled_figures(base_ms),
        level=level,
    )
