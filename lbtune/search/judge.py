"""Confirmation's verdict: the arms' pooled scores, their paired intervals, the winner.

:func:`lbtune.search.confirm.confirm` runs the rounds; :func:`verdict` judges them. Every
challenger (a candidate, and the study's best **reference** config when it differs from
the live one) is compared with the live baseline over the rounds both were measured in;
every candidate is also compared with the reference over the rounds both were measured in.
Each comparison is the composite score of the pooled requests minus the other arm's, with
the paired two-level bootstrap interval of :mod:`lbtune.search.paired`.

**Who wins.** The family is one claim per challenger (Bonferroni: 95 % family-wise, so
``1 - 0.05 / m`` per comparison for ``m`` challengers). A candidate's claim is that it
beats *both* the live config and the reference (an intersection-union test: both
intervals entirely below zero, each at that level) and met the constraints; among those,
the largest improvement over live wins. If no candidate beats both but the reference beats
live, the reference is the winner: the study found nothing better than it, and it is
better than what runs. Otherwise no config is applied, and :attr:`Confirmation.note` says
which candidate beat which arm ("trial 7 beats the live config but not the study's best
reference (least-conn, trial 2)").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from lbtune.objective import Figures, ObjectiveSpec, composite
from lbtune.search.paired import (
    finite_percentile,
    independent_draws,
    paired_draws,
    tail_quantile,
)
from lbtune.search.pooled import (
    figures_of,
    finite_or_none,
    mean_decay,
    pooled_figures,
    pooled_stretch,
)
from lbtune.search.result import Comparison, Confirmation, Pooled, RoundRun
from lbtune.search.trial import Measurement, Samples
from lbtune.targets.base import ParamSet

__all__ = ["N_BOOT", "Arm", "Arms", "Rounds", "bootstrap_diff", "pooled_score", "verdict"]

N_BOOT = 1000


@dataclass(frozen=True)
class Arm:
    """One configuration under confirmation."""

    label: str
    trial: int | None
    params: ParamSet
    role: str = ""
    """The reference trial's role (``least-conn``, ``round-robin``) for the reference arm."""


@dataclass(frozen=True)
class Arms:
    """What confirmation compares: the live baseline, the candidates, the reference."""

    baseline: Arm
    candidates: tuple[Arm, ...]
    reference: Arm | None = None
    """The study's best reference config (where it differs from the live one)."""

    @property
    def challengers(self) -> tuple[Arm, ...]:
        """Every arm compared with the baseline: the candidates, then the reference."""
        return self.candidates + ((self.reference,) if self.reference is not None else ())

    @property
    def all(self) -> tuple[Arm, ...]:
        """Every arm in the order each round runs them (the baseline first)."""
        return (self.baseline, *self.challengers)


@dataclass
class Rounds:
    """The rounds as they ran (filled in by :func:`lbtune.search.confirm.confirm`)."""

    measured: dict[tuple[int, str], Measurement] = field(default_factory=dict)
    """``(round, arm label)`` -> its measurement."""
    plan: list[tuple[int, Arm, str, Measurement | None, str]] = field(default_factory=list)
    """Every run tried or skipped: ``(round, arm, label, measurement, why not)``."""
    order: list[str] = field(default_factory=list)
    """The arm labels in the order they ran."""
    k: int = 0
    """Rounds started."""
    cap_hit: str = ""

    def both(self, a: Arm, b: Arm) -> tuple[int, ...]:
        """The rounds in which both arms were measured."""
        return tuple(
            i
            for i in range(1, self.k + 1)
            if (i, a.label) in self.measured and (i, b.label) in self.measured
        )

    def of(self, arm: Arm, rounds: Sequence[int]) -> list[Measurement]:
        return [self.measured[(i, arm.label)] for i in rounds]

    def smallest_pool(self, arms: Sequence[Arm]) -> int:
        """The smallest per-arm pooled sample count, over rounds the baseline (the first
        arm) was measured in."""
        base = arms[0].label
        rounds = {i for i, label in self.measured if label == base}
        counts = []
        for arm in arms:
            runs = [
                m.samples
                for (i, label), m in self.measured.items()
                if label == arm.label and i in rounds and m.samples is not None
            ]
            counts.append(_counts(runs))
        return min(counts) if counts else 0


def _counts(runs: Sequence[Samples]) -> int:
    """The smaller of the pooled E2E and (where any request streamed) TTFT sample counts."""
    e2e = sum(int(r.e2e.size) for r in runs)
    ttft = sum(int(np.isfinite(r.ttft).sum()) for r in runs)
    return min(e2e, ttft) if ttft else e2e


# --- figures of pooled runs (the one estimator) -----------------------------------------


def _score(tail_e2e: float, tail_ttft: float, decay: float, spec: ObjectiveSpec) -> float:
    return composite(Figures(p99_e2e_s=tail_e2e, p99_ttft_s=tail_ttft, decay=decay), spec)


def _resample(r: Samples, rng: np.random.Generator) -> Samples:
    return r.pick(rng.integers(0, r.e2e.size, size=r.e2e.size))


def _stat(
    spec: ObjectiveSpec, q: float, decay: float
) -> Callable[[Sequence[Samples]], list[float]]:
    def stat(runs: Sequence[Samples]) -> list[float]:
        e2e, ttft, p50 = figures_of(runs, q)
        if spec.kind == "capacity":
            return [pooled_stretch(runs, spec), e2e, ttft, p50]
        return [_score(e2e, ttft, decay, spec), e2e, ttft, p50]

    return stat


def pooled_score(
    runs: Sequence[Samples], spec: ObjectiveSpec, decay: float = 0.0, q: float = 99.0
) -> float:
    """The score of the requests of all ``runs`` taken together: composite at tail ``q``,
    or the capacity objective's SLO stretch."""
    if spec.kind == "capacity":
        return pooled_stretch(runs, spec)
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


# --- the verdict --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Judging:
    spec: ObjectiveSpec
    q: float
    level: float


def verdict(
    arms: Arms, rounds: Rounds, spec: ObjectiveSpec, seed: int, say: Callable[[str], None]
) -> Confirmation:
    """The verdict over the rounds (see the module docstring); the baseline was measured
    in at least one round, or the study was stopped."""
    base = arms.baseline
    base_ms = rounds.of(
        base, [i for i in range(1, rounds.k + 1) if (i, base.label) in rounds.measured]
    )
    n_min = rounds.smallest_pool(arms.all)
    q = tail_quantile(n_min)
    note = ""
    if q < 99:
        note = f"P99 from {n_min} samples: not enough; reporting P{q:g}"
        note = f"{rounds.cap_hit}: {note}" if rounds.cap_hit else note
        say(note)
    rows = tuple(_run_row(i, a, lab, m, why, q) for i, a, lab, m, why in rounds.plan)
    rows = tuple(_with_score(r, rounds.measured, spec, q) for r in rows)
    judging = _Judging(spec, q, 1 - 0.05 / max(1, len(arms.challengers)))
    vs_live = [
        _compare(arm, base, rounds, judging, seed + i) for i, arm in enumerate(arms.challengers)
    ]
    vs_ref: list[Comparison] = []
    if arms.reference is not None:
        vs_ref = [
            _compare(arm, arms.reference, rounds, judging, seed + 100 + i)
            for i, arm in enumerate(arms.candidates)
        ]
    winner, beats, why = _winner(arms, vs_live, vs_ref)
    return Confirmation(
        verdict="improved" if winner is not None else "no significant improvement",
        baseline_trial=base.trial,
        baseline_figures=pooled_figures(base_ms),
        comparisons=tuple(vs_live),
        winner=winner,
        runs_per_arm=rounds.k,
        order=tuple(rounds.order),
        baseline_samples=tuple(m.samples for m in base_ms if m.samples is not None),
        rounds=rows,
        quantile=q,
        note="; ".join(x for x in (note, why) if x),
        reference_trial=None if arms.reference is None else arms.reference.trial,
        reference_role=None if arms.reference is None else arms.reference.role,
        reference_comparisons=tuple(vs_ref),
        winner_beats=beats,
    )


def _winner(
    arms: Arms, vs_live: Sequence[Comparison], vs_ref: Sequence[Comparison]
) -> tuple[int | None, tuple[str, ...], str]:
    """``(winner trial, what it beats, what the verdict must say)``; see the module
    docstring."""
    ref = arms.reference
    ref_name = "" if ref is None else f"the study's best reference ({ref.role}, trial {ref.trial})"
    n = len(arms.candidates)
    live_ok = {c.arm: c for c in vs_live[:n] if c.significant}
    ref_ok = {c.arm for c in vs_ref if c.significant}
    both = [c for arm, c in live_ok.items() if ref is None or arm in ref_ok]
    if both:
        best = min(both, key=lambda c: c.diff)
        return best.trial, ("live",) + ((ref.role,) if ref is not None else ()), ""
    ref_live = vs_live[n] if ref is not None else None
    only_live = [c for arm, c in live_ok.items() if arm not in ref_ok]
    said = "; ".join(f"trial {c.trial} beats the live config but not {ref_name}" for c in only_live)
    if ref is not None and ref_live is not None and ref_live.significant:
        why = said or f"no candidate beats {ref_name}"
        return ref.trial, ("live",), f"{why}: the reference itself is the winner"
    return None, (), said


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
        score=finite_or_none(pooled_score(samples, spec, decay, q)),
    )


def _compare(arm: Arm, against: Arm, rounds: Rounds, j: _Judging, seed: int) -> Comparison:
    """``arm`` against ``against`` over the rounds both were measured in."""
    both = rounds.both(arm, against)
    cand_ms, base_ms = rounds.of(arm, both), rounds.of(against, both)
    cand_s = [m.samples for m in cand_ms if m.samples is not None]
    base_s = [m.samples for m in base_ms if m.samples is not None]
    decay = (mean_decay(cand_ms), mean_decay(base_ms))
    diff, lo, hi = bootstrap_diff(
        cand_s, base_s, j.spec, level=j.level, seed=seed, decay=decay, paired=True, q=j.q
    )
    cand, base = _pooled(cand_ms, both, j.spec, j.q), _pooled(base_ms, both, j.spec, j.q)
    ok = bool(cand_s) and (cand.error_rate or 0.0) <= j.spec.max_error_rate
    return Comparison(
        trial=arm.trial if arm.trial is not None else -1,
        params=arm.params,
        runs=tuple(pooled_score([s], j.spec, decay[0], j.q) for s in cand_s),
        baseline_runs=tuple(pooled_score([s], j.spec, decay[1], j.q) for s in base_s),
        diff=diff,
        ci_low=lo,
        ci_high=hi,
        relative=diff / base.score if base.score else math.nan,
        feasible=ok,
        significant=bool(ok and math.isfinite(hi) and hi < 0),
        figures=pooled_figures(cand_ms),
        arm=arm.label,
        rounds=both,
        candidate=cand,
        baseline=base,
        baseline_figures=pooled_figures(base_ms),
        level=j.level,
        against=against.label,
    )
