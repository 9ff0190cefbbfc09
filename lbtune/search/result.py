"""What a study produces, as frozen dataclasses passed around in code and written to study.json.

``StudyResult.to_dict()`` is the content of ``study.json`` (the CI contract,
documented in ``docs/optimize.md``). Figures are seconds, fractions and per-second
rates; a figure that does not exist is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lbtune.objective import Figures, ObjectiveSpec
from lbtune.scenario.runplan import RunPlan
from lbtune.targets.base import ParamSet

if TYPE_CHECKING:
    from lbtune.search.trial import Samples

STUDY_SCHEMA_VERSION = 1

Role = Literal["live", "round-robin", "least-conn", "sampled", "retry"]
Verdict = Literal["improved", "no significant improvement", "baseline is best", "not run"]


@dataclass(frozen=True)
class TrialResult:
    number: int
    state: str
    """Optuna's state name: COMPLETE, PRUNED, FAIL, RUNNING or WAITING."""
    role: str
    params: ParamSet
    objective: float | None = None
    """Composite score (also in pareto mode, where it picks among the front)."""
    values: tuple[float, ...] | None = None
    """What was told to Optuna (one value, or the three Pareto values)."""
    figures: Figures | None = None
    feasible: bool | None = None
    fail_reason: str | None = None
    duration_s: float | None = None
    intermediate: Mapping[int, float] = field(default_factory=dict)
    plan: RunPlan | None = None
    """The run plan the trial's measurement ran (started, measured window, target), where
    one came back (not for a trial that failed before)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "role": self.role,
            "params": dict(self.params),
            "objective": self.objective,
            "values": None if self.values is None else list(self.values),
            "figures": None if self.figures is None else self.figures.to_dict(),
            "feasible": self.feasible,
            "fail_reason": self.fail_reason,
            "duration_s": self.duration_s,
            "intermediate": {str(k): v for k, v in self.intermediate.items()},
            "plan": None if self.plan is None else self.plan.model_dump(mode="json", by_alias=True),
        }


@dataclass(frozen=True)
class RoundRun:
    """One arm's run in one confirmation round (a row of the report's rounds table)."""

    round: int
    """1-based round number."""
    arm: str
    """``A`` (the live baseline), ``B1``, ``B2``, ..."""
    trial: int | None
    label: str
    """The run's directory under ``runs/`` (its ``requests.parquet``)."""
    measured: bool
    reason: str = ""
    """Why the run was not measured (or is not used); empty when it was."""
    requests: int = 0
    """Latency samples: requests sent in the window that succeeded or were cut off."""
    sent: int = 0
    errors: int = 0
    tail_e2e_s: float | None = None
    """At the confirmation's tail quantile (:attr:`Confirmation.quantile`), when this
    run alone has the samples for it (else None)."""
    tail_ttft_s: float | None = None
    requests_per_s: float | None = None
    score: float | None = None
    window: tuple[float, float] | None = None
    """The measurement window (wall-clock seconds), as the run recorded it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "arm": self.arm,
            "trial": self.trial,
            "label": self.label,
            "measured": self.measured,
            "reason": self.reason,
            "requests": self.requests,
            "sent": self.sent,
            "errors": self.errors,
            "tail_e2e_s": self.tail_e2e_s,
            "tail_ttft_s": self.tail_ttft_s,
            "requests_per_s": self.requests_per_s,
            "score": self.score,
            "window": None if self.window is None else list(self.window),
        }


@dataclass(frozen=True)
class Pooled:
    """One arm's figures over the rounds of a comparison, its requests pooled."""

    rounds: tuple[int, ...]
    requests: int
    """E2E samples (also the count the tail quantile is chosen on, with ``ttft_requests``)."""
    ttft_requests: int
    tail_e2e_s: float | None
    """At :attr:`Confirmation.quantile` (P99 when the samples support it)."""
    tail_ttft_s: float | None
    p50_ttft_s: float | None
    requests_per_s: float | None
    """Mean over the runs (equal windows: the pooled completed requests per second)."""
    error_rate: float | None
    """Errors over requests sent, pooled."""
    score: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": list(self.rounds),
            "requests": self.requests,
            "ttft_requests": self.ttft_requests,
            "tail_e2e_s": self.tail_e2e_s,
            "tail_ttft_s": self.tail_ttft_s,
            "p50_ttft_s": self.p50_ttft_s,
            "requests_per_s": self.requests_per_s,
            "error_rate": self.error_rate,
            "score": self.score,
        }


@dataclass(frozen=True)
class Comparison:
    """A candidate against the baseline over the confirmation rounds both were measured in."""

    trial: int
    """Trial number of the candidate."""
    params: ParamSet
    runs: tuple[float, ...]
    """Objective of each confirmation run of the candidate (paired rounds)."""
    baseline_runs: tuple[float, ...]
    """Objective of the baseline's runs in the same rounds."""
    diff: float
    """Objective of the pooled candidate runs minus the pooled baseline runs (< 0 = better)."""
    ci_low: float
    ci_high: float
    relative: float
    """``diff`` relative to the baseline's pooled objective."""
    feasible: bool
    significant: bool
    """The CI lies entirely below zero and the candidate met the constraints."""
    figures: Figures | None = None
    """The candidate's figures over :attr:`rounds`, requests pooled (P99s, P50 TTFT, error
    rate); rates, goodput, balance and decay are the runs' means."""
    arm: str = ""
    rounds: tuple[int, ...] = ()
    """The rounds both arms were measured in: the only ones this comparison uses."""
    candidate: Pooled | None = None
    baseline: Pooled | None = None
    """The baseline over the same rounds."""
    baseline_figures: Figures | None = None
    """The baseline's figures over the same rounds, pooled like :attr:`figures`."""
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "arm": self.arm,
            "params": dict(self.params),
            "rounds": list(self.rounds),
            "runs": list(self.runs),
            "baseline_runs": list(self.baseline_runs),
            "diff": self.diff,
            "ci95": [self.ci_low, self.ci_high],
            "level": self.level,
            "relative": self.relative,
            "feasible": self.feasible,
            "significant": self.significant,
            "figures": None if self.figures is None else self.figures.to_dict(),
            "candidate": None if self.candidate is None else self.candidate.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "baseline_figures": None
            if self.baseline_figures is None
            else self.baseline_figures.to_dict(),
        }


@dataclass(frozen=True)
class Confirmation:
    verdict: Verdict
    baseline_trial: int | None
    baseline_figures: Figures | None = None
    comparisons: tuple[Comparison, ...] = ()
    winner: int | None = None
    """Trial number of the confirmed winner, or None."""
    runs_per_arm: int = 0
    """Rounds run (every arm once per round)."""
    order: tuple[str, ...] = ()
    """The interleaved run order actually used, e.g. ``("A", "B1", "B2", "A", ...)``."""
    baseline_samples: tuple[Samples, ...] = field(default=(), compare=False, repr=False)
    """The baseline's per-request samples (for the verification after rollout; not in JSON)."""
    rounds: tuple[RoundRun, ...] = ()
    """Every run of every round, measured or not (the report's rounds table)."""
    quantile: float = 99.0
    """The tail every arm is judged on: 99 unless the pooled samples were too few."""
    note: str = ""
    """Why confirmation was skipped, or why the tail is not P99 (one line; empty if neither)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "baseline_trial": self.baseline_trial,
            "baseline_figures": None
            if self.baseline_figures is None
            else self.baseline_figures.to_dict(),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "winner": self.winner,
            "runs_per_arm": self.runs_per_arm,
            "order": list(self.order),
            "quantile": self.quantile,
            "note": self.note,
            "rounds": [r.to_dict() for r in self.rounds],
        }


@dataclass(frozen=True)
class Rollout:
    applied: bool
    via: str = ""
    verified: bool | None = None
    rolled_back: bool = False
    detail: str = ""
    verification: Figures | None = None
    verify_diff: float | None = None
    verify_ci: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "via": self.via,
            "verified": self.verified,
            "rolled_back": self.rolled_back,
            "detail": self.detail,
            "verification": None if self.verification is None else self.verification.to_dict(),
            "verify_diff": self.verify_diff,
            "verify_ci95": None if self.verify_ci is None else list(self.verify_ci),
        }


@dataclass(frozen=True)
class StudyResult:
    study: str
    storage: str
    target: str
    scenario: str
    sampler: str
    spec: ObjectiveSpec
    budget: int
    trials: tuple[TrialResult, ...]
    best: int | None
    """Trial number of the best feasible completed trial (pick rule in pareto mode)."""
    baseline: int | None
    """Trial number of the live-configuration trial."""
    pareto_front: tuple[int, ...] = ()
    importances: Mapping[str, float] = field(default_factory=dict)
    confirmation: Confirmation | None = None
    rollout: Rollout | None = None
    interrupted: bool = False
    elapsed_s: float = 0.0
    report_dir: str | None = None
    notes: tuple[str, ...] = ()
    started_at: str = ""

    def trial(self, number: int | None) -> TrialResult | None:
        return next((t for t in self.trials if t.number == number), None)

    def count(self, state: str) -> int:
        return sum(t.state == state for t in self.trials)

    @property
    def improvement(self) -> float | None:
        """Relative objective change of the best trial over the baseline trial (< 0 = better)."""
        best, base = self.trial(self.best), self.trial(self.baseline)
        if best is None or base is None or best.objective is None or not base.objective:
            return None
        return best.objective / base.objective - 1

    def to_dict(self) -> dict[str, Any]:
        best = self.trial(self.best)
        return {
            "schema_version": STUDY_SCHEMA_VERSION,
            "study": self.study,
            "storage": self.storage,
            "target": self.target,
            "scenario": self.scenario,
            "sampler": self.sampler,
            "objective": self.spec.to_dict(),
            "budget": self.budget,
            "started_at": self.started_at,
            "elapsed_s": self.elapsed_s,
            "interrupted": self.interrupted,
            "counts": {s.lower(): self.count(s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")},
            "baseline_trial": self.baseline,
            "best_trial": self.best,
            "best_params": None if best is None else dict(best.params),
            "best_objective": None if best is None else best.objective,
            "improvement_vs_baseline": self.improvement,
            "pareto_front": list(self.pareto_front),
            "importances": dict(self.importances),
            "confirmation": None if self.confirmation is None else self.confirmation.to_dict(),
            "rollout": None if self.rollout is None else self.rollout.to_dict(),
            "report_dir": self.report_dir,
            "notes": list(self.notes),
            "trials": [t.to_dict() for t in self.trials],
        }
