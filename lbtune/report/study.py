"""The study report: ``study.json`` (the CI contract), ``report.md`` and ``report.html``.

Frames (pure, tested) first: the optimisation history, the before/after table (figures
as rows; the live baseline and the winner from the *same* confirmation rounds, and the
change between them), the confirmation table and its rounds. Then the renderers: Markdown, and a
self-contained HTML page whose plots (history, parameter importances, parallel
coordinates, the Pareto front in pareto mode) are base64 PNGs drawn with matplotlib's
Agg backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.errors import ConfigError
from lbtune.records.jsonform import json_text
from lbtune.report.frame import Cell, Table
from lbtune.report.html import CSS, esc, img
from lbtune.report.html import table as html_table
from lbtune.report.markdown import table as md_table
from lbtune.report.plots import _figure, _no_data, _png
from lbtune.report.screening import screening_markdown
from lbtune.report.study_plots import (
    PARETO_CAPTION,
    SLICE_CAPTION,
    best_params_html,
    best_params_markdown,
    pareto_plot,
    slice_plot,
)
from lbtune.scenario.runplan import read_run_plan
from lbtune.search.result import STUDY

if TYPE_CHECKING:
    from lbtune.objective import Figures
    from lbtune.search.result import Comparison, StudyResult


@dataclass(frozen=True)
class StudyReportPaths:
    directory: Path
    study_json: Path
    report_md: Path
    report_html: Path


# --- frames -------------------------------------------------------------------------

FIGURE_ROWS: tuple[tuple[str, str, float], ...] = (
    ("P99 end-to-end latency (ms)", "p99_e2e_s", 1000.0),
    ("P99 time to first token (ms)", "p99_ttft_s", 1000.0),
    ("P50 time to first token (ms)", "p50_ttft_s", 1000.0),
    ("throughput (req/s)", "requests_per_s", 1.0),
    ("goodput (req/s)", "goodput_per_s", 1.0),
    ("replica balance (std-dev)", "balance", 1.0),
    ("failed requests (%)", "error_rate", 100.0),
    ("throughput decay", "decay", 1.0),
)


def history(result: StudyResult) -> list[tuple[int, float, float]]:
    """``(trial, objective, best so far)`` for every completed trial with a score."""
    out, best = [], math.inf
    for t in result.trials:
        if t.state == "COMPLETE" and t.objective is not None:
            best = min(best, t.objective) if t.feasible is not False else best
            out.append((t.number, t.objective, best))
    return out


def shown_comparison(result: StudyResult) -> Comparison | None:
    """The comparison the before/after table shows: the winner's, else the closest candidate."""
    c = result.confirmation
    if c is None or not c.comparisons:
        return None
    paired = [x for x in c.comparisons if x.candidate is not None and x.baseline is not None]
    win = next((x for x in paired if x.trial == c.winner), None)
    if win is not None:
        return win
    finite = [x for x in paired if math.isfinite(x.diff)]
    return min(finite, key=lambda x: x.diff) if finite else None


def is_plain_round_robin(params: Mapping[str, object]) -> bool:
    """Round robin with equal weights and no per-server limits or length routing."""
    if params.get("algorithm", "roundrobin") != "roundrobin":
        return False
    weights = {v for k, v in params.items() if k.startswith("weight.")}
    limits = {v for k, v in params.items() if k.startswith("maxconn.")}
    return len(weights) <= 1 and limits <= {0} and not params.get("long_request_bytes")


def _live_params(result: StudyResult) -> Mapping[str, object]:
    live = next((t for t in result.trials if t.role == "live"), None)
    return live.params if live is not None else {}


def before_after(result: StudyResult) -> Table:
    """The live baseline and the winner, both from the same confirmation rounds.

    Figures as rows. Each column pools its arm's requests over the rounds in which both
    arms were measured (interleaved, same traffic); the last column is the change in
    those rounds. No search run is ever a column of this table: without a paired
    comparison (confirmation skipped) the search's live and best trials are shown with
    no change column, since they ran at different times.
    """
    comp = shown_comparison(result)
    c = result.confirmation
    if comp is None or c is None or comp.candidate is None or comp.baseline is None:
        return _unpaired(result)
    rr = is_plain_round_robin(_live_params(result))
    where = "rounds " + ", ".join(map(str, comp.rounds))
    base_label = (
        f"live baseline{' = round robin' if rr else ''} (trial {c.baseline_trial}; {where})"
    )
    if comp.trial == c.winner:
        cand_label = f"winner (trial {comp.trial}, confirmed; {where})"
    else:
        cand_label = f"best candidate (trial {comp.trial}, not significant; {where})"
    change = f"winner vs {'round robin' if rr else 'live'} (same rounds)"
    q = f"P{c.quantile:g}"
    b, w = comp.baseline, comp.candidate
    bf, wf = comp.baseline_figures, comp.figures
    rows: list[tuple[Cell, ...]] = []

    def row(name: str, a: float | None, x: float | None, scale: float = 1.0) -> None:
        av = None if a is None else a * scale
        xv = None if x is None else x * scale
        rel = f"{(xv / av - 1) * 100:+.0f} %" if av and xv is not None else None
        rows.append((name, av, xv, rel))

    row(f"{q} end-to-end latency (ms)", b.tail_e2e_s, w.tail_e2e_s, 1000.0)
    row(f"{q} time to first token (ms)", b.tail_ttft_s, w.tail_ttft_s, 1000.0)
    row("P50 time to first token (ms)", b.p50_ttft_s, w.p50_ttft_s, 1000.0)
    row("throughput (req/s)", b.requests_per_s, w.requests_per_s)
    row("goodput (req/s)", _get(bf, "goodput_per_s"), _get(wf, "goodput_per_s"))
    row("replica balance (std-dev)", _get(bf, "balance"), _get(wf, "balance"))
    row("failed requests (%)", b.error_rate, w.error_rate, 100.0)
    row("throughput decay", _get(bf, "decay"), _get(wf, "decay"))
    rel = None
    if math.isfinite(comp.relative):
        rel = (
            f"{comp.relative * 100:+.0f} % (diff {comp.diff:+.3f}, "
            f"{comp.level:.1%} CI {comp.ci_low:+.3f} .. {comp.ci_high:+.3f})"
        )
    rows.append(("composite score (lower is better)", b.score, w.score, rel))
    rows.append(("latency samples (requests)", b.requests, w.requests, None))
    return Table(("figure", base_label, cand_label, change), tuple(rows))


def _unpaired(result: StudyResult) -> Table:
    """No paired comparison: the search's live and best trials, side by side, no change."""
    live = next((t for t in result.trials if t.role == "live"), None)
    best = result.trial(result.best)
    cols: list[tuple[str, Figures | None]] = []
    if live is not None:
        cols.append((f"live (trial {live.number}, search run, {live.state.lower()})", live.figures))
    if best is not None and (live is None or best.number != live.number):
        cols.append((f"best trial {best.number} (search run, not confirmed)", best.figures))
    rows = tuple(
        (name, *(_val(f, attr, scale) for _, f in cols)) for name, attr, scale in FIGURE_ROWS
    )
    return Table(("figure", *(label for label, _ in cols)), rows)


def rounds_table(result: StudyResult) -> Table:
    """Every confirmation run, round by round, in the order it ran."""
    c = result.confirmation
    q = f"P{c.quantile:g}" if c is not None else "P99"
    cols = (
        "round",
        "arm",
        "trial",
        f"{q} E2E (ms)",
        f"{q} TTFT (ms)",
        "throughput (req/s)",
        "requests",
        "score",
        "note",
    )
    if c is None:
        return Table(cols, ())
    rows = []
    for r in c.rounds:
        note = (
            r.reason if not r.measured else ("" if r.tail_e2e_s is not None else f"< {q} samples")
        )
        rows.append(
            (
                r.round,
                r.arm,
                r.trial,
                _ms(r.tail_e2e_s),
                _ms(r.tail_ttft_s),
                r.requests_per_s,
                r.requests if r.measured else None,
                r.score,
                note,
            )
        )
    return Table(cols, tuple(rows))


def confirmation_table(result: StudyResult) -> Table:
    c = result.confirmation
    level = max((x.level for x in c.comparisons), default=0.95) if c is not None else 0.95
    cols = (
        "candidate",
        "rounds",
        "requests (cand. / base.)",
        "score",
        "baseline score",
        "diff",
        f"{level:.1%} CI",
        "verdict",
    )
    if c is None:
        return Table(cols, ())
    rows = []
    for x in c.comparisons:
        verdict = (
            "winner" if x.trial == c.winner else ("better" if x.significant else "not significant")
        )
        if not x.feasible:
            verdict = "infeasible"
        cand, base = x.candidate, x.baseline
        n = f"{cand.requests} / {base.requests}" if cand is not None and base is not None else None
        rows.append(
            (
                f"trial {x.trial} ({x.arm})" if x.arm else f"trial {x.trial}",
                len(x.rounds) or None,
                n,
                None if cand is None else cand.score,
                None if base is None else base.score,
                x.diff,
                f"{x.ci_low:+.3f} .. {x.ci_high:+.3f}",
                verdict,
            )
        )
    return Table(cols, tuple(rows))


def trials_table(result: StudyResult) -> Table:
    cols = ("trial", "role", "state", "score", "P99 e2e (s)", "P99 TTFT (s)", "errors (%)", "note")
    rows = []
    for t in result.trials:
        f = t.figures
        rows.append(
            (
                t.number,
                t.role,
                t.state,
                t.objective,
                _val(f, "p99_e2e_s", 1.0),
                _val(f, "p99_ttft_s", 1.0),
                _val(f, "error_rate", 100.0),
                t.fail_reason or "",
            )
        )
    return Table(cols, tuple(rows))


def _val(f: Figures | None, attr: str, scale: float) -> float | None:
    v = None if f is None else getattr(f, attr)
    return None if v is None else float(v) * scale


def _get(f: Figures | None, attr: str) -> float | None:
    v = None if f is None else getattr(f, attr)
    return None if v is None else float(v)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def headline(result: StudyResult) -> str:
    c = result.confirmation
    r = result.rollout
    if result.interrupted:
        return "Interrupted: the last known good was restored; `--resume` continues the study."
    if c is None or c.verdict == "not run":
        why = f" ({c.note})" if c is not None and c.note else ""
        return f"No confirmation was run{why}: nothing applied."
    if c.verdict != "improved":
        return f"{c.verdict.capitalize()}: nothing applied; the last known good stays live."
    comp = next(x for x in c.comparisons if x.trial == c.winner)
    what = (
        f"Trial {c.winner} beats the live baseline by {-comp.relative:.1%} in the same "
        f"{len(comp.rounds)} confirmation round(s) (score diff CI "
        f"{comp.ci_low:+.3f} .. {comp.ci_high:+.3f})."
    )
    if r is None:
        return what + " Not applied (--no-apply)."
    return f"{what} Rollout: {r.detail}."


# --- renderers ----------------------------------------------------------------------


def study_json(result: StudyResult) -> str:
    """``study.json``'s text (also what ``lbtune optimize --json`` prints)."""
    return json_text(STUDY, result, indent=1)


def write_study_report(out_dir: Path | str, result: StudyResult) -> StudyReportPaths:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = StudyReportPaths(d, d / "study.json", d / "report.md", d / "report.html")
    paths.study_json.write_text(study_json(result))
    paths.report_md.write_text(render_markdown(result))
    paths.report_html.write_text(render_html(result))
    return paths


def traffic(result: StudyResult) -> str | None:
    """What the trials replayed, as their recorded plan names it (for a trace: the file,
    format, window and speed), from the first trial's ``run.json``; ``None`` without one."""
    if not result.report_dir:
        return None
    for run in sorted((Path(result.report_dir) / "runs").glob("trial-*")):
        try:
            return read_run_plan(run).scenario_name
        except ConfigError:
            continue
    return None


def render_markdown(result: StudyResult) -> str:
    best = result.trial(result.best)
    played = traffic(result)
    lines = [
        f"# lbtune optimize — study `{result.study}`",
        "",
        f"Scenario `{result.scenario}`, target `{result.target}`, objective "
        f"`{result.spec.kind}`, sampler `{result.sampler}`, {len(result.trials)} trials "
        f"({result.count('COMPLETE')} complete, {result.count('PRUNED')} pruned, "
        f"{result.count('FAIL')} failed) in {result.elapsed_s / 60:.1f} min.",
        "",
        *([f"Traffic: {played}.", ""] if played else []),
        f"**{headline(result)}**",
        "",
        "## Before / after",
        "",
        md_table(before_after(result)),
        "",
        "## Confirmation (interleaved rounds against the live baseline, paired bootstrap CI)",
        "",
        md_table(confirmation_table(result)),
        "",
        "### Rounds",
        "",
        md_table(rounds_table(result)),
        "",
    ]
    if best is not None:
        lines += best_params_markdown(result, best.params)
    if result.importances:
        lines += ["## Parameter importances (PED-ANOVA)", ""]
        lines += [f"- `{k}`: {v:.3f}" for k, v in result.importances.items()] + [""]
    lines += [*screening_markdown(result.screening), "## Trials", ""]
    lines += [md_table(trials_table(result)), ""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    return "\n".join(lines)


def render_html(result: StudyResult) -> str:
    plots = render_plots(result)
    figs = "".join(img(png, key, caption) for key, (png, caption) in plots.items())
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.notes)
    best = result.trial(result.best)
    params = best_params_html(result, best.params) if best is not None else "none"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>lbtune optimize {esc(result.study)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>lbtune optimize — {esc(result.study)}</h1>"
        f"<div class='meta'>scenario {esc(result.scenario)} · target {esc(result.target)} · "
        f"objective {esc(result.spec.kind)} · sampler {esc(result.sampler)} · "
        f"{len(result.trials)} trials · {result.elapsed_s / 60:.1f} min</div>"
        + (f"<div class='meta'>traffic: {esc(played)}</div>" if (played := traffic(result)) else "")
        + f"<div class='warn'>{esc(headline(result))}</div>"
        f"<h2>Before / after</h2>{html_table(before_after(result))}"
        f"<h2>Confirmation</h2>{html_table(confirmation_table(result))}"
        f"<h3>Rounds</h3>{html_table(rounds_table(result))}"
        f"<h2>Plots</h2><div class='plots'>{figs}</div>"
        f"<h2>Best parameters</h2>{params}"
        f"<h2>Trials</h2>{html_table(trials_table(result))}"
        + (f"<h2>Notes</h2><ul class='notes'>{notes}</ul>" if notes else "")
        + "</main></body></html>\n"
    )


def render_plots(result: StudyResult) -> dict[str, tuple[bytes, str]]:
    import matplotlib

    matplotlib.use("Agg")
    out: dict[str, tuple[bytes, str]] = {}
    fig, (ax,) = _figure()
    h = history(result)
    if h:
        ax.scatter([x[0] for x in h], [x[1] for x in h], s=18, label="trial")
        ax.step([x[0] for x in h], [x[2] for x in h], where="post", color="#d62728", label="best")
        base = result.trial(result.baseline)
        if base is not None and base.objective is not None:
            ax.axhline(base.objective, color="#7f7f7f", ls="--", label="live baseline")
        ax.set_title("Optimisation history")
        ax.set_xlabel("trial")
        ax.set_ylabel("composite score (lower is better)")
        ax.legend(loc="upper right", fontsize=8)
    else:
        _no_data(ax, "no completed trial")
    out["history"] = (_png(fig), "Optimisation history: score per trial and best so far.")
    fig, (ax,) = _figure(height=max(2.0, 0.35 * len(result.importances) + 1))
    if result.importances:
        names = list(result.importances)[::-1]
        ax.barh(names, [result.importances[n] for n in names])
        ax.set_title("Parameter importances")
        ax.set_xlabel("importance (PED-ANOVA)")
        ax.set_ylabel("knob")
    else:
        _no_data(ax, "too few completed trials")
    out["importances"] = (_png(fig), "Parameter importances of the composite score.")
    out["slices"] = (slice_plot(result), SLICE_CAPTION)
    if result.spec.kind == "pareto":
        out["pareto"] = (pareto_plot(result), PARETO_CAPTION)
    return out
