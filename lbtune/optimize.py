"""``lbtune optimize`` as a library: tune the live balancer, confirm the winner, roll it out.

::

    from lbtune.optimize import OptimizeOptions, run_optimize
    result = run_optimize(OptimizeOptions(budget=20, trial_duration_s=25))
    print(result.confirmation.verdict, result.report_dir)

Steps: resolve the target (the embedded cluster unless told otherwise), make sure a last
known good exists, open or resume the Optuna study (references enqueued first), run
the ask/tell loop (:mod:`lbtune.search.study`), re-run the best candidates against the
baseline (:mod:`lbtune.search.confirm`), roll a confirmed winner out through the
target's Ansible path and verify it (rolling back when it is worse beyond the noise),
otherwise put the last known good back, and write the report. ``stop`` (Ctrl-C)
ends the running trial, restores the last known good and writes the report.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError, LbtuneError
from lbtune.history import db_path, index
from lbtune.history.index import study_entry
from lbtune.metrics.summary import Slo
from lbtune.objective import ObjectiveSpec, make_spec, pareto_front, pareto_values, pick
from lbtune.optimize_harness import real_harness
from lbtune.report.study import write_study_report
from lbtune.runplan import parse_slo
from lbtune.scenario import load_scenario
from lbtune.search.confirm import Arm, BaselineUnmeasurable, confirm
from lbtune.search.harness import Harness, rollout
from lbtune.search.pruning import make_pruner
from lbtune.search.result import Confirmation, Rollout, StudyResult, TrialResult
from lbtune.search.study import (
    LoopEvent,
    collect,
    enqueue_references,
    make_sampler,
    open_study,
    recover,
    reference_trials,
    run_loop,
    sqlite_dir,
)
from lbtune.search.trial import TrialRunner
from lbtune.targets.base import ParamSet

log = logging.getLogger(__name__)

DEFAULT_SCENARIO = "mixed"
DEFAULT_TRIAL_DURATION_S = 25.0
"""10 s warm-up + 10 s measured + 5 s cool-down of ``mixed``: ~30 s a trial with the
apply and the summary, so ``--budget 50`` takes about 25–30 minutes with confirmation."""
DEFAULT_BUDGET = 50
_STORED = (
    "budget",
    "scenario",
    "target",
    "objective",
    "weights",
    "slo",
    "trial_duration_s",
    "seed",
)


@dataclass(frozen=True)
class OptimizeOptions:
    budget: int | None = None
    """Trials in all (references included); None: the study's own on ``resume``, else 50."""
    scenario: str | None = None
    target: str | None = None
    space: str | None = None
    objective: str | None = None
    sampler: str = "tpe"
    pruner: str = "median"
    trial_duration_s: float | None = None
    study: str | None = None
    storage: str = "sqlite:///reports/studies.db"
    resume: bool = False
    apply: bool = True
    confirm_runs: int = 2
    """Confirmation rounds at least (every arm once per round)."""
    confirm_top: int = 2
    confirm_max_rounds: int = 6
    """More rounds are added while an arm has fewer pooled samples than a P99 needs,
    up to this many rounds and ``confirm_max_s`` seconds."""
    confirm_max_s: float = 900.0
    seed: int | None = None
    slo: str | None = None
    weights: str | None = None
    state_dir: Path | None = None
    cluster_config: str | None = None
    inventory: str | None = None
    reports_root: Path = Path("reports")
    out_dir: Path | None = None
    window_s: float = 5.0
    write_report: bool = True


@dataclass
class StudyProgress:
    """A snapshot for the progress display (mutated in place by :func:`run_optimize`)."""

    study: str = ""
    phase: str = "starting"
    budget: int = 0
    done: int = 0
    trial: int | None = None
    role: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    trial_started_at: float = field(default_factory=time.monotonic)
    last_value: float | None = None
    best: float | None = None
    best_trial: int | None = None
    baseline: float | None = None
    pruned: int = 0
    failed: int = 0
    message: str = ""

    @property
    def improvement(self) -> float | None:
        if self.best is None or not self.baseline:
            return None
        return self.best / self.baseline - 1


def _spec(kind: str, slo: str | None, weights: str | None, scenario: str) -> ObjectiveSpec:
    scen = load_scenario(scenario)
    s = scen.slo
    base = Slo(ttft_s=s.ttft if s and s.ttft else None, e2e_s=s.e2e if s and s.e2e else None)
    parsed = parse_slo(slo, base)
    return make_spec(
        kind,
        weights=weights,
        ttft_ref_s=parsed.ttft_s,
        e2e_ref_s=parsed.e2e_s,
        max_error_rate=parsed.max_error_rate,
    )


def _stored_attrs(storage: str, name: str | None) -> tuple[str | None, dict[str, Any]]:
    """(study name, its user attributes) for ``--resume``: the newest study if unnamed."""
    import optuna

    sqlite_dir(storage)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    if name is None:
        dated = [s for s in summaries if s.datetime_start is not None]
        if not dated:
            raise ConfigError(f"--resume: no study in {storage} to resume")
        name = max(dated, key=lambda s: s.datetime_start).study_name  # type: ignore[arg-type,return-value]
    found = next((s for s in summaries if s.study_name == name), None)
    return name, dict(found.user_attrs) if found is not None else {}


def cluster_balancer(state_dir: Path | None, cluster_config: str | None) -> str:
    """The balancer of the cluster optimize tunes: the one running in ``state_dir``,
    else the one ``cluster_config`` (or the default preset) would start."""
    st = api.status(state_dir)
    if st.running and st.endpoints is not None:
        return st.endpoints.balancer
    return load_config(cluster_config)[0].balancer


def resolve_options(opts: OptimizeOptions, harness: Harness | None = None) -> OptimizeOptions:
    """Fill unset options: stored in the study on ``--resume``, else the defaults (the
    target defaults to the tuned cluster's own balancer: ``harness``'s, else
    :func:`cluster_balancer`; another ``--target`` than that balancer is a ConfigError)."""
    stored: dict[str, Any] = {}
    name = opts.study
    if opts.resume:
        name, attrs = _stored_attrs(opts.storage, opts.study)
        stored = dict(attrs.get("options", {}))
    changes: dict[str, Any] = {"study": name}
    for key in _STORED:
        if getattr(opts, key) is None and stored.get(key) is not None:
            changes[key] = stored[key]
    out = replace(opts, **changes)
    defaults: dict[str, Any] = {
        "scenario": DEFAULT_SCENARIO,
        "objective": "composite",
        "trial_duration_s": DEFAULT_TRIAL_DURATION_S,
        "budget": DEFAULT_BUDGET,
    }
    out = replace(out, **{k: v for k, v in defaults.items() if getattr(out, k) is None})
    if harness is not None:
        out = replace(out, target=out.target or harness.target.name)
    else:
        running = cluster_balancer(out.state_dir, out.cluster_config)
        if out.target not in (None, running):
            raise ConfigError(
                f"--target {out.target}: the cluster optimize tunes runs {running}; "
                f"pass --target {running} (or leave --target out)"
            )
        out = replace(out, target=running)
    if out.study is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        part = _name_part(out.scenario or DEFAULT_SCENARIO)
        out = replace(out, study=f"{part}-{out.target}-{stamp}")
    if out.budget is None or out.budget < 1:
        raise ConfigError(f"--budget: must be >= 1, got {out.budget}")
    if out.confirm_runs < 0 or out.confirm_top < 1:
        raise ConfigError("--confirm-runs must be >= 0")
    if out.confirm_max_rounds < out.confirm_runs:
        raise ConfigError(
            f"--confirm-max-rounds ({out.confirm_max_rounds}) must be >= --confirm-runs "
            f"({out.confirm_runs})"
        )
    return out


def _name_part(scenario: str) -> str:
    """A scenario reference as a study/report name part: a path's or trace's file stem
    (``trace:/x/az.csv?speedup=4`` -> ``trace-az``), anything but ``[A-Za-z0-9._-]`` as
    ``-`` (a study name becomes a directory name and a URL path segment)."""
    ref = scenario.split("?", 1)[0]
    kind, _, rest = ref.partition(":") if ref.startswith("trace:") else ("", "", ref)
    stem = Path(rest).stem if "/" in rest or rest.endswith((".yaml", ".yml")) else rest
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{kind}-{stem}" if kind else stem).strip("-")
    return name[:60] or "scenario"


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
    assert opts.scenario and opts.target and opts.objective and opts.study and opts.budget
    stop = stop or threading.Event()
    spec = _spec(opts.objective, opts.slo, opts.weights, opts.scenario)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = opts.out_dir or opts.reports_root / f"{stamp}-optimize-{opts.study}"
    h = harness or real_harness(opts, out_dir / "runs", stop, say)
    release_lease = h.lease()  # if this process dies, a guard restores the last known good
    prog = StudyProgress(study=opts.study, budget=opts.budget)
    notify = on_progress or (lambda p: None)
    t_start = time.monotonic()

    def phase(text: str) -> None:
        prog.phase, prog.message = text, text
        say(text)
        notify(prog)

    space = h.target.space()
    lkg = h.lkg_get()
    if lkg is None:
        lkg = h.target.read_live()
        h.lkg_record(lkg, "baseline (live before the first study)")
    refs = reference_trials(space, h.target.read_live())
    sampler = make_sampler(opts.sampler, opts.seed, n_startup=len(refs) + 5)
    pruner = make_pruner(
        opts.pruner, n_references=len(refs), multi_objective=spec.kind != "composite"
    )
    study = open_study(opts.study, opts.storage, spec, sampler, pruner, resume=opts.resume)
    if opts.resume:
        phase("resuming: putting the balancer back on the last known good")
        h.target.apply(lkg)
        lost = recover(study)
        if lost:
            lost_s = ", ".join(map(str, lost))
            say(f"trials {lost_s} were left running by a dead process: marked FAIL")
    else:
        study.set_user_attr("options", {k: getattr(opts, k) for k in _STORED})
        study.set_user_attr("lkg_params", dict(lkg))
        enqueue_references(study, refs)
    runner = TrialRunner(h.target, h.measure)

    def on_event(e: LoopEvent) -> None:
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
        notify(prog)

    _seed_progress(prog, collect(study, spec))
    phase(f"study {opts.study}: {opts.budget} trials of {opts.trial_duration_s:g} s")
    run_loop(
        study,
        space,
        runner,
        spec,
        opts.budget,
        prune=opts.pruner != "none",
        stop=stop,
        on_event=on_event,
        say=say,
    )
    trials = collect(study, spec)
    base = _baseline(trials)
    best, front = _best(trials, spec)
    notes: list[str] = []
    confirmation: Confirmation | None = None
    result_rollout: Rollout | None = None
    unmeasurable: BaselineUnmeasurable | None = None
    live_no, live_params = _live(trials, study, lkg)
    try:
        if not stop.is_set():
            confirmation = _confirm(
                opts, runner, spec, trials, live_no, live_params, best, front, stop, phase
            )
            if confirmation.note:
                notes.append(confirmation.note)
        if (
            confirmation is not None
            and confirmation.winner is not None
            and opts.apply
            and not stop.is_set()
        ):
            phase(f"rolling out trial {confirmation.winner} through {h.rollout_via}")
            winner = next(t for t in trials if t.number == confirmation.winner)
            result_rollout = rollout(h, winner.params, lkg, confirmation, spec, opts.study, say)
        elif confirmation is not None and confirmation.winner is not None:
            notes.append("--no-apply: the confirmed winner was not applied")
        elif confirmation is not None and not stop.is_set():
            why = f"rollout skipped: {confirmation.verdict}; the last known good stays live"
            say(why)
            notes.append(why)
    except BaselineUnmeasurable as exc:
        unmeasurable = exc
        confirmation = Confirmation("not run", live_no, note=str(exc))
        notes.append(str(exc))
        say(str(exc))
    except LbtuneError as exc:
        notes.append(f"stopped after the search: {exc}")
        say(f"error after the search: {exc}")
    if result_rollout is None or not result_rollout.applied or result_rollout.rolled_back:
        phase("restoring the last known good")
        try:
            h.target.apply(h.lkg_get() or lkg)
        except LbtuneError as exc:
            notes.append(f"could not restore the last known good: {exc}")
    release_lease()
    if stop.is_set():
        notes.append("interrupted (Ctrl-C): the running trial was stopped; --resume continues")
    result = StudyResult(
        study=opts.study,
        storage=opts.storage,
        target=opts.target,
        scenario=opts.scenario,
        sampler=opts.sampler,
        spec=spec,
        budget=opts.budget,
        trials=tuple(trials),
        best=None if best is None else best.number,
        baseline=None if base is None else base.number,
        pareto_front=tuple(front),
        importances=_importances(study),
        confirmation=confirmation,
        rollout=result_rollout,
        interrupted=stop.is_set(),
        elapsed_s=time.monotonic() - t_start,
        report_dir=str(out_dir) if opts.write_report else None,
        notes=tuple(notes),
        started_at=stamp,
    )
    if opts.write_report:
        write_study_report(out_dir, result)
    if on_result is not None:
        on_result(opts, result)
    if unmeasurable is not None:
        where = f" (report: {out_dir})" if opts.write_report else ""
        raise BaselineUnmeasurable(f"{unmeasurable}{where}") from unmeasurable
    phase("done")
    return result


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


def _candidates(
    trials: list[TrialResult], spec: ObjectiveSpec, live: ParamSet, front: list[int], k: int
) -> list[TrialResult]:
    pool = [t for t in trials if t.state == "COMPLETE" and t.feasible and t.objective is not None]
    if spec.kind == "pareto":
        pool = [t for t in pool if t.number in front]
    pool.sort(key=lambda t: t.objective if t.objective is not None else float("inf"))
    out: list[TrialResult] = []
    for t in pool:
        if t.params != live and all(t.params != c.params for c in out):
            out.append(t)
    return out[:k]


def _live(trials: list[TrialResult], study: Any, lkg: ParamSet) -> tuple[int | None, ParamSet]:
    """The live configuration's trial number (whatever its state) and parameters.

    The baseline of the confirmation is the live configuration re-measured, never its
    search run: a failed trial 0 still names what to measure. Without a live trial
    (a study from before roles), the parameters recorded when the study began.
    """
    live = next((t for t in trials if t.role == "live"), None)
    if live is not None and live.params:
        return live.number, dict(live.params)
    stored = study.user_attrs.get("lkg_params")
    return None, dict(stored) if isinstance(stored, dict) else dict(lkg)


def _confirm(
    opts: OptimizeOptions,
    runner: Any,
    spec: ObjectiveSpec,
    trials: list[TrialResult],
    live_no: int | None,
    live: ParamSet,
    best: TrialResult | None,
    front: list[int],
    stop: threading.Event,
    phase: Callable[[str], None],
) -> Confirmation:
    """Confirm the best candidates against the live config; every skip says why."""

    def skipped(verdict: Any, why: str) -> Confirmation:
        phase(f"confirmation skipped: {why}")
        return Confirmation(verdict, live_no, note=f"confirmation skipped: {why}")

    if best is None:
        return skipped("not run", "no feasible completed trial to confirm; nothing applied")
    if best.params == live:
        return skipped("baseline is best", f"the best trial ({best.number}) is the live config")
    cands = _candidates(trials, spec, live, front, opts.confirm_top)
    if not cands:
        return skipped("baseline is best", "no feasible candidate differs from the live config")
    if opts.confirm_runs == 0:
        return skipped("not run", "--confirm-runs 0; nothing applied")
    arms = [Arm(f"B{i + 1}", t.number, t.params) for i, t in enumerate(cands)]
    phase(
        f"confirmation: {len(arms)} candidate(s) against the live config, at least "
        f"{opts.confirm_runs} round(s), up to {opts.confirm_max_rounds} for enough samples"
    )
    return confirm(
        runner,
        Arm("A", live_no, live),
        arms,
        spec,
        runs=opts.confirm_runs,
        max_rounds=opts.confirm_max_rounds,
        max_s=opts.confirm_max_s,
        seed=opts.seed or 0,
        stop=stop,
        say=phase,
    )


def _importances(study: Any) -> dict[str, float]:
    """PED-ANOVA importances of the composite score (fast, no scikit-learn); {} if too few."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(done) < 4:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(
                study,
                evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                target=lambda t: float(t.user_attrs.get("objective", float("nan"))),
            )
        return {k: float(v) for k, v in found.items()}
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        log.debug("importances not computed: %s", exc)
        return {}


def record_study(opts: OptimizeOptions, result: StudyResult) -> None:
    """Index a study in the history (a failure is a warning): the callers of
    :func:`run_optimize` that keep a history (the CLI) pass it as ``on_result``."""
    index(
        db_path(opts.storage, opts.reports_root),
        lambda: study_entry(result, opts.trial_duration_s, opts.seed),
        f"study {result.study}",
    )
