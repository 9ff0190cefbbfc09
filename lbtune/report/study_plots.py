"""The study report's per-knob view: slice plots and the knobs that mattered.

* :func:`slice_plot` — one panel per knob (as optuna-dashboard's slice plot): x = the
  knob's value, y = the composite score, colour = trial number with a colour bar. Only
  knobs that took more than one value in the study's completed trials get a panel.
* :func:`split_params` — a parameter set split into the knobs that act under it and the
  rest: a knob the space says does not act under the chosen values
  (:meth:`lbtune.targets.space.ParameterSpace.split`: hash knobs under round robin,
  weights under the LLM scheduler, ``agent.*`` without an agent; the study's own answer,
  :attr:`lbtune.search.result.TrialResult.folded`, where it recorded one), or one the
  study never moved from one value, is folded away.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.errors import LbtuneError
from lbtune.report.frame import Table
from lbtune.report.html import esc
from lbtune.report.html import table as html_table
from lbtune.report.markdown import table as md_table
from lbtune.report.plots import _figure, _no_data, _png
from lbtune.targets import TARGETS
from lbtune.targets.params import ParamValue
from lbtune.targets.space import ParameterSpace

if TYPE_CHECKING:
    from lbtune.search.result import StudyResult, TrialResult
    from lbtune.targets.space import ParameterSpace

COLUMNS = 3
SLICE_CAPTION = (
    "Score against each knob's value, one panel per knob the study varied (most important "
    "first); colour: trial number. Lower is better."
)


def _done(result: StudyResult) -> list[TrialResult]:
    return [t for t in result.trials if t.state == "COMPLETE" and t.objective is not None]


def varied_knobs(result: StudyResult) -> list[str]:
    """Knobs with more than one value over the completed trials; most important first."""
    done = _done(result)
    names = sorted({k for t in done for k in t.params})
    varied = [n for n in names if len({repr(t.params.get(n)) for t in done}) > 1]
    rank = {n: i for i, n in enumerate(result.importances)}
    return sorted(varied, key=lambda n: (rank.get(n, len(rank)), n))


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def slice_plot(result: StudyResult) -> bytes:
    """One panel per varied knob: score against the knob's value, coloured by trial."""
    done = _done(result)
    knobs = varied_knobs(result)
    if len(done) < 2 or not knobs:
        fig, (ax,) = _figure(height=2.4)
        ax.set_title("Score per knob value")
        _no_data(ax, "no knob took two values in two completed trials")
        return _png(fig)
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    rows = math.ceil(len(knobs) / COLUMNS)
    ncols = min(COLUMNS, len(knobs))
    fig = Figure(figsize=(3.4 * ncols + 1.0, 2.7 * rows), dpi=100, layout="constrained")
    grid = fig.subplots(rows, ncols, squeeze=False)
    numbers = [t.number for t in done]
    norm = Normalize(
        min(numbers), max(numbers) if max(numbers) > min(numbers) else min(numbers) + 1
    )
    cmap = colormaps["viridis"]
    scores = [float(t.objective or 0.0) for t in done]
    for i, ax in enumerate(grid.flat):
        if i >= len(knobs):
            ax.set_visible(False)
            continue
        name = knobs[i]
        raw = [t.params.get(name) for t in done]
        if all(_is_number(v) for v in raw):
            xs: Sequence[float] = [float(v) for v in raw]  # type: ignore[arg-type]
        else:
            cats = sorted({str(v) for v in raw})
            xs = [float(cats.index(str(v))) for v in raw]
            ax.set_xticks(range(len(cats)), cats, fontsize=8)
            ax.margins(x=0.2)
        ax.scatter(xs, scores, c=numbers, cmap=cmap, norm=norm, s=22, edgecolors="none")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(name, fontsize=8)
        ax.set_ylabel("score (lower is better)", fontsize=8)
        ax.tick_params(labelsize=7)
        if all(_is_number(v) for v in raw):
            ax.locator_params(axis="x", nbins=4)  # long integers (bytes) would overlap
        ax.grid(alpha=0.3)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=grid, shrink=0.9)
    bar.set_label("trial number")
    return _png(fig)


def _space_of(result: StudyResult, names: Sequence[str]) -> ParameterSpace | None:
    """The target's packaged space, expanded over the replicas the parameter names show."""
    spec = TARGETS.get(result.target)
    if spec is None:
        return None
    module = importlib.import_module(spec.split(":", 1)[0])
    path = Path(str(module.__file__)).with_name("space.yaml")
    replicas = sorted({n.split(".", 1)[1] for n in names if n.startswith(("weight.", "maxconn."))})
    try:
        return ParameterSpace.load(path, replicas=replicas)
    except (LbtuneError, OSError):
        return None


def split_by_space(
    space: ParameterSpace | None,
    params: Mapping[str, ParamValue],
    unmoved: Mapping[str, str] | None = None,
) -> tuple[dict[str, ParamValue], dict[str, str]]:
    """``(effective, folded)``: the knobs that act under ``params``; the rest, each with why.

    Folded: a knob the space says does not act under ``params``
    (:meth:`~lbtune.targets.space.ParameterSpace.split`), one the space marks ``fixed`` (the
    target fixes the agent's knobs while no agent runs), and the names in ``unmoved`` (with
    their reason).
    """
    inactive = {} if space is None else space.split(params)[1]
    return _fold(params, inactive, space, unmoved)


def _fold(
    params: Mapping[str, ParamValue],
    inactive: Mapping[str, str],
    space: ParameterSpace | None,
    unmoved: Mapping[str, str] | None,
) -> tuple[dict[str, ParamValue], dict[str, str]]:
    effective: dict[str, ParamValue] = {}
    folded: dict[str, str] = {}
    for name, value in params.items():
        spec = None if space is None else space.params.get(name)
        if name in inactive:
            folded[name] = f"{value!r}: {inactive[name]}"
        elif spec is not None and spec.fixed:
            folded[name] = (
                f"{value!r}: fixed in this cluster "
                "(weights while the agent sets them, agent.* without an agent)"
            )
        elif unmoved and name in unmoved:
            folded[name] = f"{value!r}: {unmoved[name]}"
        else:
            effective[name] = value
    return effective, folded


def split_params(
    result: StudyResult, params: Mapping[str, ParamValue]
) -> tuple[dict[str, ParamValue], dict[str, str]]:
    """:func:`split_by_space` for a study: what acts is what the study recorded for the
    trial with these parameters (its space: the cluster's, the user's ``--space``), else
    the target's packaged space; also folds knobs no trial moved."""
    done = _done(result) or list(result.trials)
    unmoved = {
        n: "fixed during this study (the same in every trial)"
        for n in params
        if len(done) > 1 and len({repr(t.params.get(n)) for t in done}) == 1
    }
    recorded = next((t.folded for t in result.trials if t.params == params and t.folded), None)
    if recorded is not None:
        return _fold(params, recorded, None, unmoved)
    return split_by_space(_space_of(result, list(params)), params, unmoved)


@dataclass(frozen=True)
class KnobChange:
    """One knob the winner sets differently from the live configuration, and what it does."""

    name: str
    live: str
    """The live value, or why the knob did not act there (another algorithm was live)."""
    winner: str
    meaning: str
    """The knob's ``help`` text from the target's ``space.yaml``."""


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def explain_changes(result: StudyResult, params: Mapping[str, ParamValue]) -> list[KnobChange]:
    """The winner's acting knobs that differ from live, each with its meaning (space order).

    A knob that acts under the winner but did not act under the live parameters (the
    ``llm.*`` weights when the winner switches ``algorithm`` to ``llm``) shows as new.
    """
    effective, _ = split_params(result, params)
    live_trial = next((t for t in result.trials if t.role == "live"), None)
    live = {} if live_trial is None else live_trial.params
    space = _space_of(result, list(params))
    specs = space.params if space is not None else {}
    live_off = live_trial.folded if live_trial is not None and live_trial.folded else None
    if live_off is None:
        live_off = {} if space is None else space.split(live)[1]
    order = {n: i for i, n in enumerate(specs)}
    changes = []
    for name in sorted(effective, key=lambda n: (order.get(n, len(order)), n)):
        value = effective[name]
        spec = specs.get(name)
        inactive = name in live_off
        if name in live and not inactive and repr(live[name]) == repr(value):
            continue
        was = "not acting (new under the winner)" if inactive or name not in live else live[name]
        meaning = " ".join(spec.help.split()) if spec is not None and spec.help else "—"
        changes.append(KnobChange(name, _shown(was), _shown(value), meaning))
    return changes


def changes_table(changes: Sequence[KnobChange]) -> Table:
    return Table(
        ("knob", "live", "winner", "what it does"),
        tuple((c.name, c.live, c.winner, c.meaning) for c in changes),
    )


def best_params_markdown(
    result: StudyResult,
    params: Mapping[str, ParamValue],
    heading: str = "Best parameters",
    who: str = "the winner",
) -> list[str]:
    """The parameters section (``heading``): what ``who`` changes and why it matters, the
    effective knobs as JSON, the folded ones listed after."""
    import json

    effective, folded = split_params(result, params)
    lines = [f"## {heading}", ""]
    changes = explain_changes(result, params)
    if changes:
        lines += [
            f"### What {who} changes",
            "",
            md_table(changes_table(changes)),
            "",
        ]
    else:
        lines += [f"{who.capitalize()} sets every acting knob as the live configuration does.", ""]
    lines += ["```json", json.dumps(effective, indent=1), "```", ""]
    if folded:
        lines += [f"{len(folded)} knobs without effect here (folded away):", ""]
        lines += [f"- `{k}` {why}" for k, why in folded.items()] + [""]
    return lines


def best_params_html(
    result: StudyResult, params: Mapping[str, ParamValue], who: str = "the winner"
) -> str:
    """``<pre>`` of the effective knobs and a closed ``<details>`` with the rest."""
    import json

    effective, folded = split_params(result, params)
    changes = explain_changes(result, params)
    out = (
        f"<h3>What {esc(who)} changes</h3>{html_table(changes_table(changes))}"
        if changes
        else f"<p>{esc(who.capitalize())} sets every acting knob as the live config does.</p>"
    )
    out += f"<pre>{esc(json.dumps(effective, indent=1))}</pre>"
    if folded:
        items = "".join(f"<li><code>{esc(k)}</code> {esc(why)}</li>" for k, why in folded.items())
        out += (
            f"<details><summary>{len(folded)} knobs without effect here (folded away)</summary>"
            f"<ul class='notes'>{items}</ul></details>"
        )
    return out


PARETO_CAPTION = "Pareto front: P99 e2e against P99 TTFT (front in red)."


def pareto_plot(result: StudyResult) -> bytes:
    """P99 E2E against P99 TTFT of the completed trials, the Pareto front in red."""
    fig, (ax,) = _figure()
    done = [t for t in result.trials if t.state == "COMPLETE" and t.figures is not None]
    if not done:
        _no_data(ax, "no completed trial")
        return _png(fig)
    xs = [t.figures.p99_e2e_s for t in done if t.figures]
    ys = [t.figures.p99_ttft_s for t in done if t.figures]
    ax.scatter(xs, ys, s=18, color="#7f7f7f", label="trial")
    front = [t for t in done if t.number in result.pareto_front and t.figures]
    ax.scatter(
        [t.figures.p99_e2e_s for t in front if t.figures],
        [t.figures.p99_ttft_s for t in front if t.figures],
        s=30,
        color="#d62728",
        label="Pareto front",
    )
    ax.set_xlabel("P99 e2e (s)")
    ax.set_ylabel("P99 TTFT (s)")
    ax.legend(fontsize=8)
    return _png(fig)
