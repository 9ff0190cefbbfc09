"""What a trial scores: the composite objective, its constraints and the Pareto view (pure).

The **composite** score (minimised) normalises each figure by its health threshold
and weighs it, as in the source material::

    score = w_e2e   * P99_e2e  / ref_e2e      (defaults 0.45, 0.8 s)
          + w_ttft  * P99_ttft / ref_ttft     (defaults 0.35, 0.35 s)
          + w_decay * decay    / ref_decay    (defaults 0.20, 0.12)

A score of 1.0 means "every figure exactly at its threshold"; below 1 is healthy.
``ref_e2e``/``ref_ttft`` come from ``--slo`` if given, else from the scenario's
``slo`` block, else the defaults above. A search measurement's P99s are
:func:`lbtune.records.quantiles.percentile` (linear) of the censored samples of the
window (:mod:`lbtune.search.tail`) and carry a 95 % bootstrap interval
(``p99_*_ci``); with ~100 samples a P99 is near the sample maximum and its interval
is wide, which is what :func:`composite_interval` passes on to the pruner.

**Constraints** follow Optuna's ``constraints_func`` convention (a value <= 0 is
feasible): ``error_rate - max_error_rate`` (default 1 %).

**Pareto** mode minimises ``(P99_e2e, P99_ttft, -goodput)``; the one to apply is the
feasible point of the front with the lowest composite score (see :func:`pick`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, TypeAdapter

from lbtune.errors import ConfigError
from lbtune.keyvalue import bad_value, in_range, parse_pairs

if TYPE_CHECKING:
    from lbtune.metrics.summary import RunSummary

ObjectiveKind = Literal["composite", "pareto"]
OBJECTIVES: tuple[ObjectiveKind, ...] = ("composite", "pareto")
PARETO_NAMES = ("p99_e2e_s", "p99_ttft_s", "neg_goodput_per_s")

DEFAULT_WEIGHTS: Mapping[str, float] = {"e2e": 0.45, "ttft": 0.35, "decay": 0.20}
DEFAULT_REFS: Mapping[str, float] = {"e2e": 0.8, "ttft": 0.35, "decay": 0.12}


def _null_is_nan(value: object) -> object:
    """A figure written as ``null`` (it was NaN or infinite) reads back as NaN."""
    return math.nan if value is None else value


def _no_interval(value: object) -> object:
    """An interval with a bound written as ``null`` (not finite) reads back as no interval."""
    return None if isinstance(value, list | tuple) and None in value else value


# JSON quirks kept from the hand-written form: a non-finite figure is written ``null``
# (pydantic's JSON mode); an interval with a ``null`` bound reads back as none. New: a
# ``null`` figure reads back as NaN (the hand-written reader let ``None`` into a float).
_Figure = Annotated[float, BeforeValidator(_null_is_nan)]
_Interval = Annotated[tuple[float, float] | None, BeforeValidator(_no_interval)]


@dataclass(frozen=True)
class Figures:
    """The few figures of one measurement the objective needs (seconds, fractions, per s).

    Its JSON form (:data:`FIGURES`; in ``study.json`` and a trial's Optuna attributes) is
    every field in field order, a non-finite figure ``null``.
    """

    p99_e2e_s: _Figure
    p99_ttft_s: _Figure
    decay: _Figure = 0.0
    error_rate: _Figure = 0.0
    requests_per_s: _Figure = 0.0
    goodput_per_s: float | None = None
    output_tokens_per_s: _Figure = 0.0
    p50_ttft_s: float | None = None
    balance: float | None = None
    """``ServerSide.replica_balance``: std-dev across replicas of SM activity, else of GPU
    utilisation (or busy fraction). Reported, not scored."""
    completed: int = 0
    p99_e2e_ci: _Interval = None
    """95 % bootstrap interval of ``p99_e2e_s`` (None when not computed)."""
    p99_ttft_ci: _Interval = None
    samples: int = 0
    """Latency samples behind the P99s (censored ones included); 0 when not known."""
    censored: int = 0
    """Of those, requests unfinished when measured (lower bounds: elapsed time)."""


FIGURES: TypeAdapter[Figures] = TypeAdapter(Figures)
"""Figures to and from their JSON form (:func:`lbtune.records.jsonform.json_data`)."""


@dataclass(frozen=True)
class ObjectiveSpec:
    """How figures become a score: weights, reference thresholds, constraint limits."""

    kind: ObjectiveKind = "composite"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    refs: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_REFS))
    max_error_rate: float = 0.01

    @property
    def directions(self) -> list[Literal["minimize", "maximize"]]:
        return ["minimize"] * (1 if self.kind == "composite" else len(PARETO_NAMES))


def figures_from_summary(summary: RunSummary) -> Figures:
    """Extract :class:`Figures`; raises ``ValueError`` when nothing succeeded in the window."""
    lat = summary.latency
    e2e = lat.e2e.p99 if lat.e2e.p99 is not None else lat.e2e.max
    ttft = lat.ttft.p99 if lat.ttft.p99 is not None else lat.ttft.max
    if ttft is None:  # nothing streamed: the whole response is the first token
        ttft = e2e
    if e2e is None or ttft is None:
        raise ValueError("no successful request in the measurement window")
    server = summary.server
    return Figures(
        p99_e2e_s=e2e,
        p99_ttft_s=ttft,
        decay=summary.throughput_decay or 0.0,
        error_rate=summary.outcomes.error_rate or 0.0,
        requests_per_s=summary.throughput.requests_per_s,
        goodput_per_s=summary.throughput.goodput_per_s,
        output_tokens_per_s=summary.throughput.output_tokens_per_s,
        p50_ttft_s=lat.ttft.p50,
        balance=None if server is None else server.replica_balance,
        completed=summary.throughput.completed,
    )


def composite(fig: Figures, spec: ObjectiveSpec) -> float:
    """The weighted, normalised score (lower is better); see the module docstring."""
    w, r = spec.weights, spec.refs
    return (
        w.get("e2e", 0.0) * fig.p99_e2e_s / r["e2e"]
        + w.get("ttft", 0.0) * fig.p99_ttft_s / r["ttft"]
        + w.get("decay", 0.0) * fig.decay / r["decay"]
    )


def composite_interval(fig: Figures, spec: ObjectiveSpec) -> tuple[float, float] | None:
    """``(low, high)`` of the composite score from the P99s' intervals; ``None`` without them.

    Each bound takes every figure at the same end of its interval, so it is at least as
    wide as the score's own interval (conservative: used to decide *not* to prune).
    """
    if fig.p99_e2e_ci is None or fig.p99_ttft_ci is None:
        return None
    (e_lo, e_hi), (t_lo, t_hi) = fig.p99_e2e_ci, fig.p99_ttft_ci
    low = composite(replace(fig, p99_e2e_s=e_lo, p99_ttft_s=t_lo), spec)
    high = composite(replace(fig, p99_e2e_s=e_hi, p99_ttft_s=t_hi), spec)
    return low, high


def pareto_values(fig: Figures) -> tuple[float, float, float]:
    """``(P99 e2e, P99 TTFT, -goodput)``; goodput falls back to completed req/s without SLO."""
    good = fig.goodput_per_s if fig.goodput_per_s is not None else fig.requests_per_s
    return (fig.p99_e2e_s, fig.p99_ttft_s, -good)


def values(fig: Figures, spec: ObjectiveSpec) -> list[float]:
    """What is told to Optuna for ``spec.kind``."""
    if spec.kind == "composite":
        return [composite(fig, spec)]
    return list(pareto_values(fig))


def constraints(fig: Figures, spec: ObjectiveSpec) -> list[float]:
    """Optuna ``constraints_func`` values: feasible when every value is <= 0."""
    return [fig.error_rate - spec.max_error_rate]


def feasible(fig: Figures, spec: ObjectiveSpec) -> bool:
    return all(c <= 0 for c in constraints(fig, spec))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is no worse than ``b`` everywhere and better somewhere (minimisation)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True)
    )


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the non-dominated points (duplicates all kept), in input order."""
    return [
        i
        for i, p in enumerate(points)
        if not any(dominates(q, p) for j, q in enumerate(points) if j != i)
    ]


def pick(candidates: Sequence[Figures], spec: ObjectiveSpec) -> int | None:
    """Index of the candidate to apply: the feasible one with the lowest composite score.

    In pareto mode only points of the feasible Pareto front are eligible; their
    composite score (same weights and references) breaks the tie. ``None`` when no
    candidate is feasible.
    """
    ok = [i for i, f in enumerate(candidates) if feasible(f, spec)]
    if not ok:
        return None
    if spec.kind == "pareto":
        front = pareto_front([pareto_values(candidates[i]) for i in ok])
        ok = [ok[i] for i in front]
    scoring = replace(spec, kind="composite")
    return min(ok, key=lambda i: composite(candidates[i], scoring))


MAX_SCORE_WEIGHT = 1000.0
"""Largest weight ``--weights`` takes (weights are relative: only their ratios count)."""


def parse_weights(
    text: str | None, base: Mapping[str, float] = DEFAULT_WEIGHTS
) -> dict[str, float]:
    """``e2e=0.5,ttft=0.5,decay=0`` → weights (keys not given keep their default)."""
    out = dict(base)
    if not text:
        return out
    flag = "--weights"
    example = "--weights e2e=0.45,ttft=0.35,decay=0.2"
    for key, value in parse_pairs(text, flag=flag, keys=DEFAULT_WEIGHTS, example=example):
        try:
            number = float(value)
        except ValueError:
            raise bad_value(flag, key, value, "a number >= 0") from None
        out[key] = in_range(flag, key, value, number, 0, MAX_SCORE_WEIGHT)
    if sum(out.values()) <= 0:
        raise ConfigError("--weights: at least one weight must be > 0")
    return out


def make_spec(
    kind: str = "composite",
    *,
    weights: str | None = None,
    ttft_ref_s: float | None = None,
    e2e_ref_s: float | None = None,
    max_error_rate: float | None = None,
) -> ObjectiveSpec:
    """A validated spec; ``None`` references keep the defaults."""
    if kind not in OBJECTIVES:
        raise ConfigError(f"Unknown objective {kind!r}. Available: {', '.join(OBJECTIVES)}")
    refs = dict(DEFAULT_REFS)
    if ttft_ref_s is not None:
        refs["ttft"] = ttft_ref_s
    if e2e_ref_s is not None:
        refs["e2e"] = e2e_ref_s
    for key, value in refs.items():
        if not value > 0:
            raise ConfigError(f"--slo {key}: the reference must be > 0, got {value}")
    limit = 0.01 if max_error_rate is None else max_error_rate
    if not 0 <= limit <= 1:
        raise ConfigError(f"--slo errors: expected a fraction in 0..1, got {limit}")
    return ObjectiveSpec(
        kind=kind,  # type: ignore[arg-type,unused-ignore]
        weights=parse_weights(weights),
        refs=refs,
        max_error_rate=limit,
    )
