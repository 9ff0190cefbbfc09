"""What a study produces, as frozen dataclasses passed around in code and written to study.json.

:data:`STUDY` (a pydantic ``TypeAdapter``, :func:`lbtune.records.jsonform.json_text`)
writes the content of ``study.json`` (the CI contract, documented in ``docs/optimize.md``).
Figures are seconds, fractions and per-second rates; a figure that does not exist is
``None``. Where the JSON form is not the fields in field order, the dataclass says so with
pydantic's means, each kept for the files already written: a renamed key
(``serialization_alias``), a computed one (``computed_field``), a left-out field
(``exclude``) and the key order (:func:`~lbtune.records.jsonform.key_order`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field, InstanceOf, TypeAdapter, computed_field, field_serializer

from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.jsonform import key_order
from lbtune.records.slo import Slo
from lbtune.scenario.runplan import RunPlan
from lbtune.search.trial import Samples
from lbtune.targets.base import ParamSet

STUDY_SCHEMA_VERSION = 1

Role = Literal["live", "round-robin", "least-conn", "screened", "sampled", "retry"]
Verdict = Literal["improved", "no significant improvement", "baseline is best", "not run"]
_Pair = tuple[float, float]
_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING")
"""The trial states ``study.json`` counts."""


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
    folded: Annotated[Mapping[str, str], Field(exclude=True)] = field(default_factory=dict)
    """The knobs of :attr:`params` that do not act under them, with why
    (:meth:`lbtune.targets.space.ParameterSpace.split`): ``params`` keeps every knob (what
    was applied); the JSON form lists them apart, as ``folded_params``."""

    @field_serializer("params")
    def _acting(self, params: ParamSet) -> ParamSet:
        """In JSON, ``params`` are the knobs that act under them."""
        return {k: v for k, v in params.items() if k not in self.folded}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def folded_params(self) -> ParamSet:
        """The knobs without effect under :attr:`params` (see :attr:`folded`)."""
        return {k: v for k, v in self.params.items() if k in self.folded}


@dataclass(frozen=True)
class TwinPrediction:
    """One completed live trial beside the twin's prediction of its config."""

    trial: int
    role: str
    predicted: float | None
    """The twin's composite score (lower is better)."""
    measured: float | None
    """The live trial's."""
    predicted_p99_e2e_s: float | None = None
    measured_p99_e2e_s: float | None = None
    predicted_rps: float | None = None
    measured_rps: float | None = None


@dataclass(frozen=True)
class Screening:
    """The screening stage (``optimize --screen``): configs screened in the twin, those
    sent live, and every live trial beside the twin's prediction."""

    screened: int
    sent_live: int
    window_s: float
    """Virtual seconds per screened config."""
    live_window_s: float
    """Virtual seconds of each prediction of a live trial (the live trials' duration)."""
    cpu_s: float
    wall_s: float
    rows: tuple[TwinPrediction, ...] = ()
    rank_corr: float | None = None
    """Spearman's rank correlation of the twin's and the live scores (3 pairs or more)."""
    note: str = ""


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
    # JSON quirk kept from the hand-written form: ``ci_low``, ``ci_high`` written as
    # the pair ``ci95``.
    ci_low: Annotated[float, Field(exclude=True)]
    """In JSON with ``ci_high`` as the pair :attr:`ci95`."""
    ci_high: Annotated[float, Field(exclude=True)]
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
    against: str = "A"
    """The arm compared with: ``A`` (the live config) or ``R`` (the study's best reference;
    :attr:`Confirmation.reference_comparisons`). ``baseline*`` are that arm's figures."""

    # JSON quirk kept from the hand-written form: this key order.
    _json = key_order(
        "trial", "arm", "params", "rounds", "runs", "baseline_runs", "diff", "ci95", "level"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ci95(self) -> tuple[float, float]:
        """``(ci_low, ci_high)``: the interval of :attr:`diff`."""
        return self.ci_low, self.ci_high


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
    # JSON quirk kept from the hand-written form: the samples left out (arrays, not figures).
    baseline_samples: Annotated[tuple[InstanceOf[Samples], ...], Field(exclude=True)] = field(
        default=(), compare=False, repr=False
    )
    """The baseline's per-request samples (for the verification after rollout; not in JSON)."""
    rounds: tuple[RoundRun, ...] = ()
    """Every run of every round, measured or not (the report's rounds table)."""
    quantile: float = 99.0
    """The tail every arm is judged on: 99 unless the pooled samples were too few."""
    note: str = ""
    """Why confirmation was skipped, why the tail is not P99, or which arm a candidate did
    not beat (one line; empty if none of these)."""
    reference_trial: int | None = None
    """The study's best reference config (arm ``R``: its best round-robin or least-conn
    trial) where it was confirmed alongside, else None."""
    reference_role: str | None = None
    reference_comparisons: tuple[Comparison, ...] = ()
    """Each candidate against the reference, over the rounds both were measured in (the
    reference against live is in :attr:`comparisons`, arm ``R``)."""
    winner_beats: tuple[str, ...] = ()
    """What the winner was shown to beat: ``live``, and the reference's role when it is a
    candidate that beat that too."""

    # JSON quirk kept from the hand-written form: ``rounds`` last.
    _json = key_order(
        "verdict", "baseline_trial", "baseline_figures", "comparisons", "winner",
        "runs_per_arm", "order", "quantile", "note", "rounds",
    )  # fmt: skip


@dataclass(frozen=True)
class Rollout:
    applied: bool
    via: str = ""
    verified: bool | None = None
    rolled_back: bool = False
    detail: str = ""
    verification: Figures | None = None
    verify_diff: float | None = None
    # JSON quirk kept from the hand-written form: ``verify_ci`` written as ``verify_ci95``.
    verify_ci: Annotated[_Pair | None, Field(serialization_alias="verify_ci95")] = None


@dataclass(frozen=True)
class CapacityAtSlo:
    """A capacity study's (``--objective capacity``) rate and SLO, and the capacity at
    that SLO of the live config and of the winner in the twin (req/s)."""

    rate: float
    """The offered rate every trial ran at (open loop)."""
    attainment: float
    slo: Slo
    baseline: float | None = None
    baseline_kind: str | None = None
    """``bracketed``, ``above`` (at least), ``below`` (none): the twin's search's kind."""
    winner: float | None = None
    winner_kind: str | None = None
    note: str | None = None
    """Why there is no twin figure."""

    @classmethod
    def of(cls, spec: ObjectiveSpec) -> CapacityAtSlo:
        """A capacity objective's rate, share and SLO, before any twin figure."""
        assert spec.slo is not None and spec.rate is not None
        return cls(rate=spec.rate, attainment=spec.share, slo=spec.slo)


@dataclass(frozen=True)
class StudyResult:
    study: str
    storage: str
    target: str
    scenario: str
    sampler: str
    # JSON quirk kept from the hand-written form: ``spec`` written as ``objective``,
    # ``best`` and ``baseline`` as ``best_trial`` and ``baseline_trial``; computed keys
    # (below); this key order.
    spec: Annotated[ObjectiveSpec, Field(serialization_alias="objective")]
    budget: int
    trials: tuple[TrialResult, ...]
    best: Annotated[int | None, Field(serialization_alias="best_trial")]
    """Trial number of the best feasible completed trial (pick rule in pareto mode)."""
    baseline: Annotated[int | None, Field(serialization_alias="baseline_trial")]
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
    screening: Screening | None = None
    capacity: Annotated[CapacityAtSlo | None, Field(exclude_if=lambda v: v is None)] = None
    """The capacity objective's rate and the twin's capacity before and after (no JSON key
    under another objective)."""

    _json = key_order(
        "schema_version", "study", "storage", "target", "scenario", "sampler", "objective",
        "budget", "started_at", "elapsed_s", "interrupted", "counts", "baseline_trial",
        "best_trial", "best_params", "best_objective", "improvement_vs_baseline",
        "winner_trial", "winner_params", "pareto_front", "importances", "confirmation",
        "rollout", "report_dir", "notes",
    )  # fmt: skip

    def trial(self, number: int | None) -> TrialResult | None:
        return next((t for t in self.trials if t.number == number), None)

    def count(self, state: str) -> int:
        return sum(t.state == state for t in self.trials)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def schema_version(self) -> int:
        return STUDY_SCHEMA_VERSION

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """Trials by state (``complete``, ``pruned``, ``fail``, ``running``)."""
        return {s.lower(): self.count(s) for s in _STATES}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def best_params(self) -> ParamSet | None:
        """The search's best trial's acting knobs (not confirmed: see ``winner_params``)."""
        best = self.trial(self.best)
        return None if best is None else _acting(best)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def winner_trial(self) -> int | None:
        """The confirmed winner: the configuration the study shows, rolls out and
        ``lbtune apply --study`` applies (None without one)."""
        return None if self.confirmation is None else self.confirmation.winner

    @computed_field  # type: ignore[prop-decorator]
    @property
    def winner_params(self) -> ParamSet | None:
        """The confirmed winner's acting knobs (its trial row lists the folded ones)."""
        won = self.trial(self.winner_trial)
        return None if won is None else _acting(won)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def best_objective(self) -> float | None:
        best = self.trial(self.best)
        return None if best is None else best.objective

    @computed_field(alias="improvement_vs_baseline")  # type: ignore[prop-decorator]
    @property
    def improvement(self) -> float | None:
        """Relative objective change of the best trial over the baseline trial (< 0 = better)."""
        best, base = self.trial(self.best), self.trial(self.baseline)
        if best is None or base is None or best.objective is None or not base.objective:
            return None
        return best.objective / base.objective - 1


def _acting(t: TrialResult) -> ParamSet:
    return {k: v for k, v in t.params.items() if k not in t.folded}


STUDY: TypeAdapter[StudyResult] = TypeAdapter(StudyResult)
"""A study to its JSON form (``study.json``, ``lbtune optimize --json``)."""
