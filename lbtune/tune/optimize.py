"""``lbtune optimize`` as a library: tune the live balancer, confirm the winner, roll it out.

::

    from lbtune.tune.optimize import run_optimize
    from lbtune.tune.options import OptimizeOptions

    result = run_optimize(OptimizeOptions(budget=20, trial_duration_s=25))
    print(result.confirmation.verdict, result.report_dir)

Steps: resolve the target (the embedded cluster unless told otherwise), make sure a last
known good exists, open or resume the Optuna study (references enqueued first), run
the ask/tell loop (:mod:`lbtune.search.study`), re-run the best candidates against the
baseline (:mod:`lbtune.search.confirm`), roll a confirmed winner out through the
target's Ansible path and verify it (rolling back when it is worse beyond the noise),
otherwise put the last known good back, and write the report. ``stop`` (Ctrl-C, SIGTERM)
ends the running trial, restores the last known good and writes the report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lbtune.errors import BalancerDown
from lbtune.history import add_entry, db_path
from lbtune.history.index import study_entry
from lbtune.objective import ObjectiveSpec, pareto_front, pareto_values, pick
from lbtune.records.slo import parse_slo
from lbtune.report.study import write_study_report
from lbtune.safety.files import inside, name_part
from lbtune.scenario.runplan import RunPlan
from lbtune.search.confirm import BaselineUnmeasurable
from lbtune.search.harness import Harness
from lbtune.search.pruning import make_pruner, pruning_line
from lbtune.search.result import CapacityAtSlo, StudyResult, TrialResult
from lbtune.search.stored import collect
from lbtune.search.study import (
    REFERENCE_ROLES,
    LoopEvent,
    LoopOptions,
    enqueue_references,
    make_sampler,
    open_study,
    recover,
    reference_trials,
    run_loop,
)
from lbtune.search.trial import TrialRunner
from lbtune.targets.base import ParamSet
from lbtune.targets.space import ParameterSpace
from lbtune.tune.after import AfterSearch, SearchDone, after_search, restore
from lbtune.tune.capacity_study import trial_rate, twin_capacities
from lbtune.tune.harness import plan_trials, real_harness
from lbtune.tune.importance import importances
from lbtune.tune.options import (
    STORED,
    OptimizeOptions,
    StudyProgress,
    objective_spec,
    resolve_options,
)
from lbtune.tune.screen import ScreenRequest, screen_study
from lbtune.twin.fitted import TwinProfile, trusted_profile

__all__ = ["record_study", "run_optimize"]

log = logging.getLogger(__name__)


def _twin_profile(opts: OptimizeOptions) -> TwinProfile | None:
    """The fitted profile the screen simulates with, checked before any load: refused
    (ConfigError) when its validation is off by more than ``max_twin_error`` and the study
    screens; unused with ``--screen 0``."""
    if opts.twin_profile is None or opts.screen == 0 or opts.resume:
        return None
    return trusted_profile(opts.twin_profile, opts.max_twin_error, "tune live only: --screen 0")


def run_optimize(
    opts: OptimizeOptions,
    *,
    on_progress: Callable[[StudyProgress], None] | None = None,
    say: Callable[[str], None] = log.info,
    stop: threading.Event | None = None,
    harness: Harness | None = None,
    on_result: Callable[[OptimizeOptions, StudyResult], None] | None = None,
) -> StudyResult:
    """Run (or resume) a study end to end; see the module docstring.

    ``on_result`` gets the result once the report is written, also when the study then
    fails for a baseline it could not measure: the CLI indexes the study there
    (:func:`record_study`)."""
    opts = resolve_options(opts, harness)
    if opts.objective == "capacity" and opts.rate is None:
        opts = replace(opts, rate=_capacity_rate(opts, say))
    assert opts.scenario and opts.target and opts.objective and opts.study and opts.budget
    profile = _twin_profile(opts)
    stop = stop or threading.Event()
    trial_opts = plan_trials(opts)  # the study's run plan: its one read of the scenario
    assert trial_opts.plan is not None
    spec = _spec(opts, trial_opts.plan)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = opts.out_dir or inside(
        opts.reports_root, f"{stamp}-optimize-{name_part(opts.study, 'study')}", "--study"
    )
    h = harness or real_harness(opts, trial_opts, out_dir / "runs", stop, say, spec)
    release_lease = h.lease()  # if this process dies, a guard restores the last known good
    show = _Progress(StudyProgress(study=opts.study, budget=opts.budget), on_progress, say)
    run = _Run(opts, spec, stamp, out_dir)
    space, lkg = _space_and_lkg(h)
    study = _open(opts, spec, h, space, lkg, show)
    runner = TrialRunner(h.target, h.measure, check_balancer=h.check_balancer)
    screener, screen_note = (None, None)
    if not opts.resume:
        req = ScreenRequest(
            opts.screen, h.state_dir, trial_opts, opts.seed, opts.budget, h.target.name, profile
        )
        screener, screen_note = screen_study(req, space, study, spec, show.phase)
    before = collect(study, spec)
    _seed_progress(show.prog, before)
    show.phase(f"study {opts.study}: {opts.budget} trials of {opts.trial_duration_s:g} s")
    show.say(_pruning_line(opts, spec, trial_opts.plan, before))
    try:
        loop = LoopOptions(opts.budget, _pruner(opts, spec) != "none", stop, show.on_event, say)
        run_loop(study, space, runner, spec, loop)
    except BalancerDown:
        release_lease()  # nothing left to guard; the study is stored and resumable
        raise
    trials = collect(study, spec, space)
    best, front = _best(trials, spec)
    screening = None if screener is None else screener.compare(trials, show.say)
    done = SearchDone(opts, spec, trials, study, lkg, best, front)
    after = after_search(done, h, runner, stop, show)
    after.screening = screening
    after.notes[:0] = [screen_note] if screen_note else []
    restore(h, lkg, after, show)
    release_lease()
    if stop.is_set():
        after.notes.append(
            "interrupted (Ctrl-C or SIGTERM): the running trial was stopped; --resume continues"
        )
    capacity = _capacity(spec, screener is not None and not stop.is_set(), after, trials, show)
    if capacity is not None and capacity.note is None:
        capacity = twin_capacities(trial_opts, spec, h.state_dir, lkg, _winner(after, trials))
    result = run.result(study, trials, after, stop.is_set(), capacity)
    if opts.write_report:
        write_study_report(out_dir, result)
    if on_result is not None:
        on_result(opts, result)
    if after.unmeasurable is not None:
        where = f" (report: {out_dir})" if opts.write_report else ""
        raise BaselineUnmeasurable(f"{after.unmeasurable}{where}") from after.unmeasurable
    show.phase("done")
    return result


def _capacity(
    spec: ObjectiveSpec, twin: bool, after: AfterSearch, trials: list[TrialResult], show: _Progress
) -> CapacityAtSlo | None:
    """A capacity study's row before the twin's figures (a note where the twin is not
    used: no screening, or interrupted); None for another objective."""
    if spec.kind != "capacity":
        return None
    row = CapacityAtSlo.of(spec)
    if not twin:
        return replace(row, note="no twin capacity (the twin did not screen this study)")
    show.phase("capacity at the SLO in the twin: the live config and the winner")
    return row


def _winner(after: AfterSearch, trials: list[TrialResult]) -> ParamSet | None:
    """The confirmed winner's parameters (None: none was confirmed)."""
    number = None if after.confirmation is None else after.confirmation.winner
    won = next((t for t in trials if t.number == number), None)
    return None if won is None else won.params


def _spec(opts: OptimizeOptions, plan: RunPlan) -> ObjectiveSpec:
    """The study's objective over its plan's SLO (``--slo`` with its TPOT bound for the
    capacity objective)."""
    assert opts.objective is not None
    return objective_spec(
        opts.objective,
        plan.slo_value(),
        opts.weights,
        slo_text=opts.slo,
        attainment=opts.attainment,
        rate=opts.rate,
    )


def _capacity_rate(opts: OptimizeOptions, say: Callable[[str], None]) -> float:
    """The capacity study's trial rate placed by the twin (:func:`trial_rate`), on the
    study's traffic and the objective's SLO."""
    first = plan_trials(opts)  # closed loop until the rate is known: its SLO and seed
    assert first.plan is not None
    bounds = parse_slo(opts.slo, first.plan.slo_value(), tpot=True)
    share = 0.99 if opts.attainment is None else opts.attainment
    return trial_rate(first, bounds, share, opts.state_dir, say)


def _pruner(opts: OptimizeOptions, spec: ObjectiveSpec) -> str:
    """``--pruner``, or none under the capacity objective: its score (the SLO stretch of
    the whole window) has no partial value to prune on."""
    return "none" if spec.kind == "capacity" else opts.pruner


def _pruning_line(
    opts: OptimizeOptions, spec: ObjectiveSpec, plan: RunPlan, trials: list[TrialResult]
) -> str:
    """What the pruner can do with this study's trial length, said once at its start."""
    refs = sum(t.role in REFERENCE_ROLES for t in trials)
    return pruning_line(
        _pruner(opts, spec),
        plan.window_end_s - plan.window_start_s,
        multi_objective=not spec.single,
        window_s=opts.window_s,
        n_references=refs,
    )


def _space_and_lkg(h: Harness) -> tuple[ParameterSpace, ParamSet]:
    """The target's space and its last known good (the live config, recorded as such, when
    there is none yet)."""
    space = h.target.space()
    lkg = h.lkg_get()
    if lkg is None:
        lkg = h.target.read_live()
        h.lkg_record(lkg, "baseline (live before the first study)")
    return space, lkg


@dataclass(frozen=True)
class _Run:
    """This run of a study: its options, objective, start, report directory; :meth:`result`
    is what it came to."""

    opts: OptimizeOptions
    spec: ObjectiveSpec
    stamp: str
    out_dir: Path
    t_start: float = field(default_factory=time.monotonic)

    def result(
        self,
        study: Any,
        trials: list[TrialResult],
        after: AfterSearch,
        interrupted: bool,
        capacity: CapacityAtSlo | None = None,
    ) -> StudyResult:
        o = self.opts
        assert o.study and o.target and o.scenario and o.budget
        best, front = _best(trials, self.spec)
        base = _baseline(trials)
        return StudyResult(
            study=o.study,
            storage=o.storage,
            target=o.target,
            scenario=o.scenario,
            sampler=o.sampler,
            spec=self.spec,
            budget=o.budget,
            trials=tuple(trials),
            best=None if best is None else best.number,
            baseline=None if base is None else base.number,
            pareto_front=tuple(front),
            importances=importances(study),
            confirmation=after.confirmation,
            rollout=after.rollout,
            interrupted=interrupted,
            elapsed_s=time.monotonic() - self.t_start,
            report_dir=str(self.out_dir) if o.write_report else None,
            notes=tuple(after.notes),
            started_at=self.stamp,
            screening=after.screening,
            capacity=capacity,
        )


class _Progress:
    """The progress snapshot (:class:`StudyProgress`), updated from the study's events
    and handed to ``on_progress``; :meth:`phase` also says what the study does now."""

    def __init__(
        self,
        prog: StudyProgress,
        on_progress: Callable[[StudyProgress], None] | None,
        say: Callable[[str], None],
    ) -> None:
        self.prog, self.say = prog, say
        self._notify = on_progress or (lambda p: None)

    def phase(self, text: str) -> None:
        """A new step: "score so far" belonged to the trial that ran (none runs now)."""
        self.prog.phase, self.prog.message, self.prog.last_value = text, text, None
        self.say(text)
        self._notify(self.prog)

    def on_event(self, e: LoopEvent) -> None:
        prog = self.prog
        prog.done, prog.trial, prog.role, prog.params = e.done, e.number, e.role, dict(e.params)
        if e.kind == "start":
            prog.phase, prog.trial_started_at, prog.last_value = "trial", time.monotonic(), None
        elif e.kind == "window":
            prog.last_value = e.value
        else:
            prog.pruned += e.state == "PRUNED"
            prog.failed += e.state == "FAIL"
            if e.state == "COMPLETE" and e.value is not None:
                prog.last_value = e.value
                if e.role == "live" and prog.baseline is None:
                    prog.baseline = e.value
                if prog.best is None or e.value < prog.best:
                    prog.best, prog.best_trial = e.value, e.number
        self._notify(prog)


def _open(
    opts: OptimizeOptions,
    spec: ObjectiveSpec,
    h: Harness,
    space: ParameterSpace,
    lkg: ParamSet,
    show: _Progress,
) -> Any:
    """The Optuna study: resumed (the balancer back on the last known good, trials a dead
    process left running marked FAIL), or new with the reference trials enqueued."""
    assert opts.study is not None
    refs = reference_trials(space, h.target.read_live())
    sampler = make_sampler(opts.sampler, opts.seed, n_startup=len(refs) + 5)
    pruner = make_pruner(
        _pruner(opts, spec), n_references=len(refs), multi_objective=not spec.single
    )
    study = open_study(opts.study, opts.storage, spec, sampler, pruner, resume=opts.resume)
    if opts.resume:
        show.phase("resuming: putting the balancer back on the last known good")
        h.target.apply(lkg)
        lost = recover(study)
        if lost:
            lost_s = ", ".join(map(str, lost))
            show.say(f"trials {lost_s} were left running by a dead process: marked FAIL")
    else:
        study.set_user_attr("options", {k: getattr(opts, k) for k in STORED})
        study.set_user_attr("lkg_params", dict(lkg))
        enqueue_references(study, refs)
    return study


def _seed_progress(prog: StudyProgress, trials: list[TrialResult]) -> None:
    """On resume: counts and best so far from the trials already in the study."""
    for t in trials:
        prog.pruned += t.state == "PRUNED"
        prog.failed += t.state == "FAIL"
        if t.state == "COMPLETE" and t.objective is not None:
            if t.role == "live" and prog.baseline is None:
                prog.baseline = t.objective
            if prog.best is None or t.objective < prog.best:
                prog.best, prog.best_trial = t.objective, t.number
    prog.done = sum(t.state in ("COMPLETE", "PRUNED", "FAIL") for t in trials)


def _baseline(trials: list[TrialResult]) -> TrialResult | None:
    done = [t for t in trials if t.state == "COMPLETE" and t.figures is not None]
    for role in ("live", "round-robin"):
        found = next((t for t in done if t.role == role), None)
        if found is not None:
            return found
    return None


def _best(trials: list[TrialResult], spec: ObjectiveSpec) -> tuple[TrialResult | None, list[int]]:
    done = [t for t in trials if t.state == "COMPLETE" and t.figures is not None]
    figs = [t.figures for t in done if t.figures is not None]
    i = pick(figs, spec)
    front: list[int] = []
    if spec.kind == "pareto":
        ok = [t for t in done if t.feasible]
        front = [
            ok[j].number for j in pareto_front([pareto_values(t.figures) for t in ok if t.figures])
        ]
    return (None if i is None else done[i]), front


def record_study(opts: OptimizeOptions, result: StudyResult) -> None:
    """Index a study in the history (a failure is a warning): the callers of
    :func:`run_optimize` that keep a history (the CLI) pass it as ``on_result``."""
    add_entry(
        db_path(opts.storage, opts.reports_root),
        lambda: study_entry(result, opts.trial_duration_s, opts.seed),
        f"study {result.study}",
    )
