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

**Capacity** mode (``--objective capacity``) tunes for the capacity at an SLO
(``lbtune capacity``'s figure): the trials run open loop at one offered rate near the
capacity, and the score is the **SLO stretch** at the attainment asked: each request's
stretch is the largest of ``TTFT / ttft``, ``TPOT / tpot`` and ``E2E / e2e`` over the
SLO's bounds (a failed request: infinite), and the score is the stretch the asked share
of requests stays within (:func:`stretch_at`: the ``attainment``-th percentile). At most 1
means the SLO holds at that rate for that share; 1.3 means its bounds would have to be
30 % looser. A config with more capacity holds the SLO further past the rate, so it scores
lower there; unlike the attainment itself (a count of requests under a line), the
stretch moves with every request's latency, which a sampler and a paired bootstrap can
tell apart on a few hundred requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import BeforeValidator, Field, TypeAdapter

from lbtune.errors import ConfigError
from lbtune.keyvalue import bad_value, in_range, parse_pairs
from lbtune.records.quantiles import percentile
from lbtune.records.slo import Slo

if TYPE_CHECKING:
    from lbtune.metrics.summary import RunSummary

ObjectiveKind = Literal["composite", "pareto", "capacity"]
OBJECTIVES: tuple[ObjectiveKind, ...] = ("composite", "pareto", "capacity")
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
# A figure only one objective has: no JSON key where it is None, so that the JSON of a
# study under another objective keeps the form it had.
_Absent = Annotated[float | None, Field(exclude_if=lambda v: v is None)]


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
    slo_stretch: _Absent = None
    """The capacity objective's score (:func:`stretch_at`); None (and no JSON key) under
    another objective."""
    attainment: _Absent = None
    """Share of the window's requests within the capacity objective's SLO (stretch at
    most 1; a request cut off or still open within it is not judged); None under another
    objective."""


FIGURES: TypeAdapter[Figures] = TypeAdapter(Figures)
"""Figures to and from their JSON form (:func:`lbtune.records.jsonform.json_data`)."""


@dataclass(frozen=True)
class ObjectiveSpec:
    """How figures become a score: weights, reference thresholds, constraint limits."""

    kind: ObjectiveKind = "composite"
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    refs: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_REFS))
    max_error_rate: float = 0.01
    slo: Annotated[Slo | None, Field(exclude_if=lambda v: v is None)] = None
    """The capacity objective's per-request bounds (TTFT, TPOT, E2E); None (and no JSON
    key) otherwise, as :attr:`attainment` and :attr:`rate`."""
    attainment: _Absent = None
    """The capacity objective's share of requests that must meet :attr:`slo` (0.99)."""
    rate: _Absent = None
    """The capacity objective's offered rate (req/s) every trial runs at."""

    @property
    def directions(self) -> list[Literal["minimize", "maximize"]]:
        return ["minimize"] * (len(PARETO_NAMES) if self.kind == "pareto" else 1)

    @property
    def share(self) -> float:
        """The capacity objective's share (:attr:`attainment`, default 0.99)."""
        return 0.99 if self.attainment is None else self.attainment

    @property
    def reads_ttft(self) -> bool:
        """Whether a trial's score depends on its TTFTs: a composite with a TTFT weight,
        the Pareto front (P99 TTFT is one of its axes), capacity with a TTFT bound."""
        if self.kind == "composite":
            return self.weights.get("ttft", 0.0) > 0
        if self.kind == "capacity":
            return self.slo is not None and self.slo.ttft_s is not None
        return True

    @property
    def single(self) -> bool:
        """One value per trial (composite or capacity), not a Pareto front."""
        return self.kind != "pareto"


FAILED_STRETCH = 1e9
"""A failed request's stretch: no bound stretches far enough (finite, so percentiles stay
defined)."""


def stretches(
    ttft: Sequence[float] | np.ndarray[tuple[int], np.dtype[np.float64]],
    tpot: Sequence[float] | np.ndarray[tuple[int], np.dtype[np.float64]],
    e2e: Sequence[float] | np.ndarray[tuple[int], np.dtype[np.float64]],
    errors: int,
    slo: Slo,
) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    """Each request's SLO stretch (paired samples, seconds; NaN TTFT: not streamed, the
    response's end is its first token; NaN TPOT: none, not judged on it) and
    :data:`FAILED_STRETCH` for each of ``errors``."""
    e = np.asarray(e2e, dtype=np.float64)
    t = np.asarray(ttft, dtype=np.float64)
    p = np.asarray(tpot, dtype=np.float64) if len(tpot) else np.full(e.shape, np.nan)
    out = np.zeros(e.shape)
    if slo.ttft_s is not None:
        out = np.maximum(out, np.where(np.isnan(t), e, t) / slo.ttft_s)
    if slo.tpot_s is not None:
        out = np.maximum(out, np.nan_to_num(p / slo.tpot_s, nan=0.0))
    if slo.e2e_s is not None:
        out = np.maximum(out, e / slo.e2e_s)
    return np.concatenate([out, np.full(errors, FAILED_STRETCH)])


def stretch_at(values: np.ndarray[tuple[int], np.dtype[np.float64]], share: float) -> float:
    """The stretch ``share`` of the requests stay within: the ``100 * share``-th
    percentile (:func:`lbtune.records.quantiles.percentile`); NaN without requests."""
    return percentile(values, 100 * share) if values.size else math.nan


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


def score(fig: Figures, spec: ObjectiveSpec) -> float:
    """A single-valued objective's score of ``fig`` (lower is better): the SLO stretch
    under ``capacity`` (NaN when not computed), else the composite."""
    if spec.kind == "capacity":
        return math.nan if fig.slo_stretch is None else fig.slo_stretch
    return composite(fig, spec)


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
    if spec.single:
        return [score(fig, spec)]
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
    composite score (same weights and references) breaks the tie. In capacity mode, the
    lowest SLO stretch. ``None`` when no candidate is feasible.
    """
    ok = [i for i, f in enumerate(candidates) if feasible(f, spec)]
    if not ok:
        return None
    if spec.kind == "capacity":
        return min(ok, key=lambda i: score(candidates[i], spec))
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
    slo: Slo | None = None,
    attainment: float | None = None,
    rate: float | None = None,
) -> ObjectiveSpec:
    """A validated spec; ``None`` references keep the defaults. ``capacity`` needs
    ``slo`` (a bound at least), ``attainment`` in (0, 1) and the trials' ``rate``."""
    if kind not in OBJECTIVES:
        raise ConfigError(f"Unknown objective {kind!r}. Available: {', '.join(OBJECTIVES)}")
    if kind == "capacity":
        _check_capacity(slo, attainment, rate)
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
        slo=slo if kind == "capacity" else None,
        attainment=(0.99 if attainment is None else attainment) if kind == "capacity" else None,
        rate=rate if kind == "capacity" else None,
    )


def _check_capacity(slo: Slo | None, attainment: float | None, rate: float | None) -> None:
    """The capacity objective's SLO, share and rate, or a one-line ConfigError."""
    if slo is None or all(b is None for b in (slo.ttft_s, slo.tpot_s, slo.e2e_s)):
        raise ConfigError(
            "--objective capacity: the SLO has no latency bound; give --slo "
            "(e.g. --slo ttft=2s,tpot=100ms,e2e=30s)"
        )
    if attainment is not None and not 0 < attainment < 1:
        raise ConfigError(f"--attainment: must be between 0 and 1 (e.g. 0.95), got {attainment:g}")
    if rate is None or not rate > 0:
        raise ConfigError(
            "--objective capacity: the trials need an offered rate; give --rate R (req/s; "
            "e.g. the capacity `lbtune capacity` found)"
        )
