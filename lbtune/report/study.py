"""The study report: ``study.json`` (the CI contract), ``report.md`` and ``report.html``.

The frames are :mod:`lbtune.report.study_frame`'s (pure, tested). Here the renderers:
Markdown, and a self-contained HTML page whose plots (history, parameter importances, parallel
coordinates, the Pareto front in pareto mode) are base64 PNGs drawn with matplotlib's
Agg backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.errors import ConfigError
from lbtune.records.jsonform import json_text
from lbtune.report.html import CSS, esc, img
from lbtune.report.html import table as html_table
from lbtune.report.markdown import table as md_table
from lbtune.report.plots import _figure, _no_data, _png
from lbtune.report.screening import screening_markdown
from lbtune.report.study_frame import (
    before_after,
    capacity_line,
    confirmation_table,
    headline,
    history,
    rounds_table,
    score_name,
    shown_trial,
    trials_table,
)
from lbtune.report.study_plots import (
    PARETO_CAPTION,
    SLICE_CAPTION,
    best_params_html,
    best_params_markdown,
    pareto_plot,
    slice_plot,
)
from lbtune.safety.secrets import scrub
from lbtune.scenario.runplan import read_run_plan
from lbtune.search.result import STUDY

if TYPE_CHECKING:
    from lbtune.search.result import StudyResult


@dataclass(frozen=True)
class StudyReportPaths:
    directory: Path
    study_json: Path
    report_md: Path
    report_html: Path


# --- renderers ----------------------------------------------------------------------


def study_json(result: StudyResult) -> str:
    """``study.json``'s text (also what ``lbtune optimize --json`` prints)."""
    return json_text(STUDY, result, indent=1)


def write_study_report(out_dir: Path | str, result: StudyResult) -> StudyReportPaths:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = StudyReportPaths(d, d / "study.json", d / "report.md", d / "report.html")
    paths.study_json.write_text(study_json(result))  # json_text scrubs every string
    paths.report_md.write_text(scrub(render_markdown(result)))  # no secret in a report
    paths.report_html.write_text(scrub(render_html(result)))
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


def _paragraph(text: str | None) -> list[str]:
    return [] if text is None else [text, ""]


def render_markdown(result: StudyResult) -> str:
    shown, heading, who = shown_trial(result)
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
        *_paragraph(capacity_line(result)),
        "## Confirmation (interleaved rounds against the live baseline and the study's best "
        "reference, paired bootstrap CI)",
        "",
        md_table(confirmation_table(result)),
        "",
        "### Rounds",
        "",
        md_table(rounds_table(result)),
        "",
    ]
    if shown is not None:
        lines += best_params_markdown(result, shown.params, heading, who)
    if result.importances:
        lines += ["## Parameter importances (PED-ANOVA)", ""]
        lines += [f"- `{k}`: {v:.3f}" for k, v in result.importances.items()] + [""]
    lines += [*screening_markdown(result.screening), "## Trials", ""]
    lines += [md_table(trials_table(result)), ""]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    return "\n".join(lines)


def _capacity_html(result: StudyResult) -> str:
    line = capacity_line(result)
    return "" if line is None else f"<p>{esc(line)}</p>"


def render_html(result: StudyResult) -> str:
    plots = render_plots(result)
    figs = "".join(img(png, key, caption) for key, (png, caption) in plots.items())
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.notes)
    shown, heading, who = shown_trial(result)
    params = best_params_html(result, shown.params, who) if shown is not None else "none"
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
        f"{_capacity_html(result)}"
        f"<h2>Confirmation</h2>{html_table(confirmation_table(result))}"
        f"<h3>Rounds</h3>{html_table(rounds_table(result))}"
        f"<h2>Plots</h2><div class='plots'>{figs}</div>"
        f"<h2>{esc(heading)}</h2>{params}"
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
        ax.set_ylabel(f"{score_name(result)} (lower is better)")
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
    out["importances"] = (_png(fig), f"Parameter importances of the {score_name(result)}.")
    out["slices"] = (slice_plot(result), SLICE_CAPTION)
    if result.spec.kind == "pareto":
        out["pareto"] = (pareto_plot(result), PARETO_CAPTION)
    return out
