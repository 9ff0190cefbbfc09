"""History entries from what a stress run or a study produced (pure but for reads).

A stress run keeps its summary's figures (role ``run``) and the balancer config its plan
recorded (what was live, as far as lbtune knows). A study keeps its baseline trial (the
live config measured as trial 0), the confirmed winner, the verification run after the
rollout, and whether the winner was accepted (rolled out, verified, not rolled back).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune import __version__
from lbtune.errors import ConfigError
from lbtune.history.store import Entry, KeyFigures
from lbtune.objective import figures_from_summary
from lbtune.scenario.runplan import RunPlan, read_run_plan
from lbtune.targets.lkg import params_hash

if TYPE_CHECKING:
    from lbtune.metrics.summary import RunSummary
    from lbtune.objective import Figures
    from lbtune.search.result import StudyResult

log = logging.getLogger(__name__)

__all__ = ["from_objective", "recorded_window", "stress_entry", "study_entry"]


def from_objective(
    fig: Figures,
    records_dir: Path | str | None = None,
    window: tuple[float, float] | None = None,
    degraded: bool | None = None,
) -> KeyFigures:
    return KeyFigures(
        p99_e2e_s=fig.p99_e2e_s,
        p50_ttft_s=fig.p50_ttft_s,
        p99_ttft_s=fig.p99_ttft_s,
        requests_per_s=fig.requests_per_s,
        output_tokens_per_s=fig.output_tokens_per_s,
        goodput_per_s=fig.goodput_per_s,
        error_rate=fig.error_rate,
        degraded=degraded,
        completed=fig.completed,
        records_dir=None if records_dir is None else str(records_dir),
        window_start_s=None if window is None else window[0],
        window_end_s=None if window is None else window[1],
    )


def stress_entry(summary: RunSummary, plan: RunPlan, run_dir: Path, ran_s: float) -> Entry:
    """The entry of one stress run: its summary, its plan as run, the directory it wrote
    and how long it ran."""
    s = summary
    window = (s.window.start - s.run_start, s.window.end - s.run_start)
    degraded = s.generator.degraded
    try:
        fig = from_objective(figures_from_summary(s), run_dir, window, degraded)
    except ValueError:  # nothing succeeded: keep what there is
        fig = KeyFigures(
            error_rate=s.outcomes.error_rate,
            requests_per_s=s.throughput.requests_per_s,
            degraded=degraded,
            completed=0,
            records_dir=str(run_dir),
            window_start_s=window[0],
            window_end_s=window[1],
        )
    params = plan.target.params
    ld = plan.load
    load = {
        "duration_s": round(ran_s, 1),
        "users": ld.users,
        "rate": ld.rate,
        "seed": plan.seed,
        "mode": s.mode,
    }
    return Entry(
        kind="stress",
        time=s.run_start,
        scenario=s.scenario,
        target=s.target,
        report_dir=str(run_dir),
        config_hash=None if params is None else params_hash(params),
        params=params,
        load=load,
        figures={"run": fig},
        lbtune_version=__version__,
    )


def study_entry(result: StudyResult, trial_duration_s: float | None, seed: int | None) -> Entry:
    """The entry of one study (``trial_duration_s`` and ``seed``: its options')."""
    rdir = Path(result.report_dir) if result.report_dir else None
    conf, ro = result.confirmation, result.rollout
    accepted = bool(ro is not None and ro.applied and ro.verified and not ro.rolled_back)
    figures: dict[str, KeyFigures] = {}
    base = result.trial(result.baseline)
    if base is not None and base.figures is not None:
        runs = None if rdir is None else rdir / "runs" / f"trial-{base.number:04d}"
        figures["baseline"] = from_objective(base.figures, runs, recorded_window(runs))
    winner = None if conf is None else result.trial(conf.winner)
    if conf is not None and conf.winner is not None:
        comp = next((c for c in conf.comparisons if c.trial == conf.winner), None)
        if comp is not None and comp.figures is not None:
            figures["winner"] = from_objective(comp.figures)
    if ro is not None and ro.verification is not None:
        runs = None if rdir is None else rdir / "runs" / "verify"
        figures["verification"] = from_objective(ro.verification, runs, recorded_window(runs))
    kept = winner if accepted and winner is not None else base
    params = None if kept is None else dict(kept.params)
    return Entry(
        kind="study",
        time=time.time() - result.elapsed_s,
        scenario=result.scenario,
        target=result.target,
        report_dir=None if rdir is None else str(rdir),
        study=result.study,
        config_hash=None if params is None else params_hash(params),
        params=params,
        load={"duration_s": trial_duration_s, "seed": seed, "budget": result.budget},
        verdict=None if conf is None else conf.verdict,
        accepted=accepted,
        baseline_trial=result.baseline,
        winner_trial=None if conf is None else conf.winner,
        figures=figures,
        lbtune_version=__version__,
    )


def recorded_window(run_dir: Path | None) -> tuple[float, float] | None:
    """A run's measurement window (seconds after its start) as its ``run.json`` records it;
    ``None`` without one (a run directory from before lbtune recorded its plan)."""
    if run_dir is None:
        return None
    try:
        plan = read_run_plan(run_dir)
    except ConfigError as exc:
        log.debug("history: no recorded window (%s)", exc)
        return None
    if plan.started_at is None or plan.window_start is None or plan.window_end is None:
        return plan.window_start_s, plan.window_end_s
    return plan.window_start - plan.started_at, plan.window_end - plan.started_at
