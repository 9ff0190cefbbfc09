"""``lbtune compare``: did B get better or worse than A, beyond the noise?

::

    from lbtune.compare.verdict import compare, load_pair, parse_fail_on
    a, b = load_pair("reports/last-night", "reports/tonight")
    result = compare(a, b, fail_on=parse_fail_on("p99=+10%,ttft=+10%,goodput=-5%"))
    print(result.verdict, [f.label for f in result.failures])

A side is a stress report (``summary.json`` with ``requests.parquet`` beside it) or a
study report (``study.json`` with its ``runs/``); see :mod:`lbtune.compare.sources`.
For every figure the change of B against A (relative; in percentage points for the
error rate) gets a bootstrap confidence interval from the per-request records
(:mod:`lbtune.metrics.bootstrap`, seeded, A and B resampled independently). The level
is family-wise over the figures tested (Bonferroni), so "no significant change" means
that none of the figures moved beyond the noise at that level. A change is a
*significant improvement* or *significant regression* when its interval excludes
zero, otherwise *noise*; without records on both sides it is *untested*. The
comparison **fails** only for a significant regression beyond its ``--fail-on``
threshold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import TypeAdapter, computed_field

from lbtune.compare.sources import Side, load_pair, load_side
from lbtune.errors import ConfigError
from lbtune.keyvalue import bad_value, in_range, parse_pairs
from lbtune.metrics.bootstrap import interval, point, resample, sample_counts
from lbtune.records.jsonform import key_order
from lbtune.records.quantiles import MIN_SAMPLES, FloatArray

__all__ = [
    "DEFAULT_FAIL_ON",
    "FIGURES",
    "CompareResult",
    "FigureChange",
    "FigureDef",
    "Side",
    "compare",
    "load_pair",
    "load_side",
    "parse_fail_on",
]

Status = Literal["improvement", "regression", "noise", "untested"]
SCHEMA_VERSION = 1
NO_RECORDS = "no records: not tested for significance"


@dataclass(frozen=True)
class FigureDef:
    key: str
    label: str
    unit: str
    """Display unit: ``ms`` (from seconds), ``req/s``, ``tok/s``, ``%`` (from a fraction)."""
    better: Literal["lower", "higher"]
    aliases: tuple[str, ...] = ()

    @property
    def relative(self) -> bool:
        """Changes are relative (B/A − 1), except the error rate's (B − A, in points)."""
        return self.key != "error_rate"


FIGURES: tuple[FigureDef, ...] = (
    FigureDef("ttft_p50", "P50 TTFT", "ms", "lower", ("p50_ttft", "ttft50")),
    FigureDef("ttft_p99", "P99 TTFT", "ms", "lower", ("ttft", "p99_ttft")),
    FigureDef("e2e_p99", "P99 E2E", "ms", "lower", ("p99", "e2e", "p99_e2e")),
    FigureDef("itl_p50", "P50 ITL", "ms", "lower", ("itl", "p50_itl")),
    FigureDef("requests_per_s", "throughput", "req/s", "higher", ("throughput", "rps", "req")),
    FigureDef("output_tokens_per_s", "output tokens/s", "tok/s", "higher", ("tokens", "tok")),
    FigureDef("goodput_per_s", "goodput", "req/s", "higher", ("goodput",)),
    FigureDef("error_rate", "error rate", "%", "lower", ("errors", "error")),
)
_BY_NAME = {n: f for f in FIGURES for n in (f.key, *f.aliases)}
_PERCENTILE_FIGURES = frozenset({"ttft_p50", "ttft_p99", "e2e_p99", "itl_p50"})
DEFAULT_FAIL_ON = "p99=+10%,ttft=+10%,goodput=-5%,errors=+1%"
"""Used when ``--fail-on`` is not given."""
_THRESHOLD = re.compile(r"^\s*([+-]?)\s*([0-9]*\.?[0-9]+)\s*(%|pp)?\s*$")
MAX_RESAMPLES = 100_000
"""Most bootstrap resamples ``--resamples`` takes (each costs a pass over the records)."""
MAX_FAIL_ON = 10.0
"""Largest ``--fail-on`` limit: a change of 1000 %."""


def parse_fail_on(text: str | None) -> dict[str, float]:
    """``p99=+10%,goodput=-5%`` → ``{"e2e_p99": 0.10, "goodput_per_s": 0.05}``.

    Each threshold is how far a figure may move in its *worse* direction before a
    significant regression fails: ``+`` for latencies and errors, ``-`` for throughput
    and goodput (the sign may be left out). Relative for every figure but the error
    rate, whose ``%`` means percentage points (``errors=+1%``: 0.5 % → 1.5 % fails).
    ``all=+5%`` sets every figure; later entries override earlier ones.
    """
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    pairs = parse_pairs(
        text,
        flag="--fail-on",
        keys=["all", *sorted(_BY_NAME)],
        example="--fail-on p99=+10%,ttft=+10%,goodput=-5%",
        fold_case=True,
    )
    for name, value in pairs:
        m = _THRESHOLD.match(value)
        if not m:
            raise bad_value("--fail-on", name, value, "a change like +10% or -5%")
        sign, number, unit = m.groups()
        amount = float(number) / 100 if unit in ("%", "pp") else float(number)
        in_range("--fail-on", name, value, amount, 0, MAX_FAIL_ON, "(1000 %)")
        for fig in FIGURES if name == "all" else (_BY_NAME[name],):
            worse = "+" if fig.better == "lower" else "-"
            if sign and sign != worse and name != "all" and amount > 0:
                change = "an increase" if worse == "+" else "a decrease"
                raise bad_value(
                    "--fail-on",
                    name,
                    value,
                    f"{name}={worse}{number}{unit or ''}",
                    f"has the wrong sign: a regression of {fig.label} is {change}",
                )
            out[fig.key] = amount
    return out


@dataclass(frozen=True)
class FigureChange:
    """One figure of A and B, the change and its interval, and the verdict on it."""

    key: str
    label: str
    unit: str
    better: Literal["lower", "higher"]
    relative: bool
    a: float | None
    b: float | None
    change: float | None
    """``b/a − 1`` (relative) or ``b − a`` (the error rate); positive = went up."""
    ci: tuple[float, float] | None
    status: Status
    threshold: float | None = None
    """The ``--fail-on`` limit (a magnitude in the worse direction); ``None`` = not gated."""
    failed: bool = False
    note: str = ""


@dataclass(frozen=True)
class CompareResult:
    """B against A. Its JSON form (:data:`RESULT`, ``--format json``) starts with
    ``schema_version``, the computed :attr:`verdict` and :attr:`failed`, and names the
    figures of :attr:`regressions`, :attr:`improvements` and :attr:`failures` by key."""

    a: Side
    b: Side
    figures: tuple[FigureChange, ...]
    level: float
    """Family-wise confidence level over the tested figures."""
    resamples: int
    seed: int
    fail_on: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    # JSON quirk kept from the hand-written form: the computed keys (below), this order.
    _json = key_order(
        "schema_version", "verdict", "failed", "a", "b", "level", "resamples", "seed",
        "fail_on", "regressions", "improvements", "failures", "figures", "notes",
    )  # fmt: skip

    @property
    def failures(self) -> tuple[FigureChange, ...]:
        return tuple(f for f in self.figures if f.failed)

    @property
    def regressions(self) -> tuple[FigureChange, ...]:
        return tuple(f for f in self.figures if f.status == "regression")

    @property
    def improvements(self) -> tuple[FigureChange, ...]:
        return tuple(f for f in self.figures if f.status == "improvement")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> str:
        if self.failed:
            return "regression"
        if self.regressions:
            return "regression within thresholds" if not self.improvements else "mixed"
        if self.improvements:
            return "improvement"
        if all(f.status == "untested" for f in self.figures):
            return "not tested (no records)"
        return "no significant change"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    @computed_field(alias="regressions")  # type: ignore[prop-decorator]
    @property
    def regression_keys(self) -> list[str]:
        return [f.key for f in self.regressions]

    @computed_field(alias="improvements")  # type: ignore[prop-decorator]
    @property
    def improvement_keys(self) -> list[str]:
        return [f.key for f in self.improvements]

    @computed_field(alias="failures")  # type: ignore[prop-decorator]
    @property
    def failure_keys(self) -> list[str]:
        return [f.key for f in self.failures]


RESULT: TypeAdapter[CompareResult] = TypeAdapter(CompareResult)
"""A comparison to its JSON form (:func:`lbtune.records.jsonform.json_text`)."""


def _change(fig: FigureDef, a: Any, b: Any) -> Any:
    """Relative or absolute change; works elementwise on bootstrap arrays. A relative
    change from zero is not finite (numpy's division, also for two plain floats: Python's
    raised ZeroDivisionError when side A's figure was 0)."""
    if not fig.relative:
        return b - a
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(b, a) - 1


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


@dataclass(frozen=True)
class _Judging:
    """What every figure of one comparison is judged with."""

    tested: bool
    """Both sides have per-request records: changes get intervals."""
    few: Mapping[str, str]
    """Percentile figures without enough samples, and why."""
    boots_a: Mapping[str, FloatArray]
    boots_b: Mapping[str, FloatArray]
    alpha: float
    """Per-figure error rate (Bonferroni over the figures tested)."""
    resamples: int
    gates: Mapping[str, float]


def compare(
    a: Side,
    b: Side,
    *,
    fail_on: Mapping[str, float] | None = None,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> CompareResult:
    """Compare every figure of ``b`` against ``a``; see the module docstring."""
    gates = parse_fail_on(DEFAULT_FAIL_ON) if fail_on is None else dict(fail_on)
    if not 0 < level < 1:
        raise ConfigError(f"--level: expected a confidence level between 0 and 1, got {level}")
    if not 0 <= seed < 2**63:
        raise ConfigError(f"--seed: must be 0..{2**63 - 1}, got {seed}")
    if not 100 <= resamples <= MAX_RESAMPLES:
        raise ConfigError(f"--resamples: must be 100..{MAX_RESAMPLES}, got {resamples}")
    tested = a.arrays is not None and b.arrays is not None
    pa = point(a.arrays) if a.arrays is not None and tested else dict(a.figures)
    pb = point(b.arrays) if b.arrays is not None and tested else dict(b.figures)
    few = _too_few(a, b) if tested else {}
    shown = [
        f for f in FIGURES if pa.get(f.key) is not None or pb.get(f.key) is not None or f.key in few
    ]
    boots_a: Mapping[str, FloatArray] = {}
    boots_b: Mapping[str, FloatArray] = {}
    if tested:
        assert a.arrays is not None and b.arrays is not None
        rng_a, rng_b = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        boots_a, boots_b = (
            resample(a.arrays, resamples, rng_a),
            resample(b.arrays, resamples, rng_b),
        )
    n_tested = sum(
        1 for f in shown if _finite(pa.get(f.key)) and _finite(pb.get(f.key)) and f.key not in few
    )
    judging = _Judging(
        tested, few, boots_a, boots_b, (1 - level) / max(1, n_tested), resamples, gates
    )
    return CompareResult(
        a=a,
        b=b,
        figures=tuple(_judge(fig, pa.get(fig.key), pb.get(fig.key), judging) for fig in shown),
        level=level,
        resamples=resamples,
        seed=seed,
        fail_on=gates,
        notes=_notes(a, b, tested),
    )


def _judge(fig: FigureDef, va: float | None, vb: float | None, j: _Judging) -> FigureChange:
    """One figure's change, its interval, its status and whether it fails its gate."""
    change = _change(fig, va, vb) if _finite(va) and _finite(vb) else None
    if change is not None and not math.isfinite(change):
        change = None
    ci: tuple[float, float] | None = None
    note = ""
    status: Status = "untested"
    if fig.key in j.few:
        note = j.few[fig.key]
    elif change is None:
        note = "missing on one side" if va is None or vb is None else "A is zero: no ratio"
        if (va is None or vb is None) and fig.key in _PERCENTILE_FIGURES:
            note += " (too few samples for this percentile, see docs/metrics.md)"
    elif not j.tested:
        note = NO_RECORDS
    else:
        draws = _change(fig, j.boots_a[fig.key], j.boots_b[fig.key])
        draws = draws[np.isfinite(draws)]
        if draws.size < j.resamples // 2:
            note = "too few requests to resample"
        else:
            lo, hi = ci = interval(draws, 1 - j.alpha)
            status = "noise"
            if lo > 0 or hi < 0:
                up_is_worse = fig.better == "lower"
                status = "regression" if (lo > 0) == up_is_worse else "improvement"
    limit = j.gates.get(fig.key)
    worse_by = None if change is None else (change if fig.better == "lower" else -change)
    failed = status == "regression" and limit is not None and worse_by is not None
    failed = failed and worse_by > limit  # type: ignore[operator]
    return FigureChange(
        key=fig.key,
        label=fig.label,
        unit=fig.unit,
        better=fig.better,
        relative=fig.relative,
        a=va,
        b=vb,
        change=change,
        ci=ci,
        status=status,
        threshold=limit,
        failed=bool(failed),
        note=note,
    )


def _too_few(a: Side, b: Side) -> dict[str, str]:
    """Percentile figures that A's or B's samples cannot support (fewer than
    :data:`~lbtune.records.quantiles.MIN_SAMPLES` on either side): no verdict on them."""
    assert a.arrays is not None and b.arrays is not None
    na, nb = sample_counts(a.arrays), sample_counts(b.arrays)
    out: dict[str, str] = {}
    for key in _PERCENTILE_FIGURES:
        pct = key.rsplit("_", 1)[1]
        need = MIN_SAMPLES[pct]
        if min(na[key], nb[key]) < need:
            out[key] = (
                f"not enough samples (A {na[key]}, B {nb[key]}; a {pct.upper()} needs {need} "
                "on each side): not tested"
            )
    return out


def _notes(a: Side, b: Side, tested: bool) -> tuple[str, ...]:
    notes: list[str] = []
    if not tested:
        missing = " and ".join(s.name for s in (a, b) if s.arrays is None)
        notes.append(f"{NO_RECORDS} (no per-request records for {missing})")
    if a.scenario != b.scenario:
        notes.append(
            f"A ran scenario {a.scenario!r} and B {b.scenario!r}: the figures describe "
            "different traffic"
        )
    if a.slo != b.slo:
        notes.append("A and B were judged against different SLOs: goodput is not comparable")
    for s in (a, b):
        notes.extend(f"{s.name}: {n}" for n in s.notes)
    return tuple(notes)
