"""Renderers of a :class:`~lbtune.compare.verdict.CompareResult`: a frame, Markdown and JSON.

:func:`frame` is the pure table the CLI prints (rich) and the Markdown embeds;
:func:`render_markdown` suits a pull-request comment or a CI step summary and names
the figures that regressed first; :func:`render_json` is the machine-readable form
(values in seconds, fractions and per-second rates, as in ``summary.json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lbtune.compare.verdict import RESULT
from lbtune.records.jsonform import json_text
from lbtune.report.frame import Table
from lbtune.report.markdown import table

if TYPE_CHECKING:
    from lbtune.compare.verdict import CompareResult, FigureChange

_SCALE = {"ms": 1000.0, "%": 100.0}


def value(v: float | None, unit: str) -> str:
    """A figure in its display unit: ``412 ms``, ``3.57 req/s``, ``0.40 %``."""
    if v is None:
        return "–"
    x = v * _SCALE.get(unit, 1.0)
    a = abs(x)
    num = f"{x:,.0f}" if a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}"
    return f"{num} {unit}"


def change(f: FigureChange, x: float | None = None) -> str:
    """``+12.3 %`` (relative) or ``+0.40 pp`` (the error rate)."""
    c = f.change if x is None else x
    if c is None:
        return "–"
    return f"{c * 100:+.1f} %" if f.relative else f"{c * 100:+.2f} pp"


def interval(f: FigureChange) -> str:
    if f.ci is None:
        return "–"
    lo, hi = f.ci
    unit = "%" if f.relative else "pp"
    digits = 1 if f.relative else 2
    return f"{lo * 100:+.{digits}f} .. {hi * 100:+.{digits}f} {unit}"


def limit(f: FigureChange) -> str:
    if f.threshold is None:
        return "not gated"
    sign = "+" if f.better == "lower" else "-"
    return f"{sign}{f.threshold * 100:g} {'%' if f.relative else 'pp'}"


def verdict(f: FigureChange) -> str:
    if f.failed:
        return "REGRESSION (beyond limit)"
    if f.status == "regression":
        return "regression (within limit)" if f.threshold is not None else "regression"
    if f.status == "untested":
        return f"untested ({f.note})" if f.note else "untested"
    return f.status


def frame(result: CompareResult) -> Table:
    pct = round(result.level * 100)
    cols = ("figure", "A", "B", "change", f"{pct} % CI", "limit", "verdict")
    rows = tuple(
        (
            f.label,
            value(f.a, f.unit),
            value(f.b, f.unit),
            change(f),
            interval(f),
            limit(f),
            verdict(f),
        )
        for f in result.figures
    )
    return Table(cols, rows)


def _named(figs: tuple[FigureChange, ...], with_limit: bool) -> str:
    parts = []
    for f in figs:
        extra = f", limit {limit(f)}" if with_limit and f.threshold is not None else ""
        extra += ", not gated" if with_limit and f.threshold is None else ""
        parts.append(f"{f.label} ({change(f)}, CI {interval(f)}{extra})")
    return ", ".join(parts)


def headline(result: CompareResult) -> str:
    """One line: the verdict and the figures behind it."""
    if result.failed:
        return "Regression: " + _named(result.failures, True)
    if result.regressions:
        return f"{result.verdict.capitalize()}: worse " + _named(result.regressions, False)
    if result.improvements:
        return "Improvement: " + _named(result.improvements, False)
    return result.verdict.capitalize() + "."


def render_markdown(result: CompareResult) -> str:
    mark = "❌" if result.failed else "✅"
    lines = [f"### {mark} lbtune compare: {result.verdict}", ""]
    if result.failed:
        lines.append("**Regressed beyond the thresholds: " + _named(result.failures, True) + "**")
        lines.append("")
    within = tuple(f for f in result.regressions if not f.failed)
    if within:
        lines += ["Significantly worse, not failing: " + _named(within, True), ""]
    if result.improvements:
        lines += ["Significantly better: " + _named(result.improvements, False), ""]
    for s in (result.a, result.b):
        runs = f", {s.runs} runs pooled" if s.runs > 1 else ""
        recs = "" if s.arrays is not None else ", no records"
        lines.append(f"- **{s.name}**: {s.label} — `{s.path}` ({s.requests} requests{runs}{recs})")
    lines += [
        "",
        f"Change of B against A; {round(result.level * 100)} % bootstrap confidence intervals, "
        f"family-wise over the figures tested ({result.resamples} resamples of the requests "
        f"of each run, seed {result.seed}). Fails only on a significant regression beyond "
        "its limit.",
        "",
        table(frame(result)),
    ]
    if result.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def render_json(result: CompareResult) -> str:
    return json_text(RESULT, result, indent=1)
