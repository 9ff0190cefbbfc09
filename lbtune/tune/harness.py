"""The real pieces a study runs against: the target (the embedded cluster or the running
one), the measurement (one ``run_stress`` per trial), the rollout path
(``apply_params(via="ansible")``) and the last known good.

:func:`real_harness` wires them into a :class:`lbtune.search.harness.Harness` for
:func:`lbtune.tune.optimize.run_optimize`; tests pass a harness of fakes instead.

Every trial sees the same traffic (same scenario, seed and duration: the run plan is made
once, :func:`plan_trials`). While the load runs, the records the run's one tail of its
record files hands on with each snapshot are gathered and, at each checkpoint of the
measured part (after warm-up; :func:`lbtune.search.pruning.checkpoints`), the figures so
far are handed to the study's window hook (intermediate values for the pruner); when the
hook asks to stop, the load is stopped and the measurement is marked ``stopped``. The
window is the plan's (:meth:`~lbtune.scenario.runplan.RunPlan.window_at`), as for
``--until-samples`` and the summary.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from lbtune.apply import apply_params
from lbtune.apply.lease import hold
from lbtune.cluster import api
from lbtune.errors import ConfigError
from lbtune.loadgen.collect import Progress
from lbtune.loadgen.health import GeneratorHealth
from lbtune.loadgen.recordio import read_records
from lbtune.metrics.censor import censored_samples
from lbtune.objective import Figures, ObjectiveSpec, figures_from_summary
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import without_tpot
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions, StressResult, run_stress
from lbtune.run.target import resolve_target
from lbtune.scenario.runplan import RunPlan
from lbtune.search.harness import Harness
from lbtune.search.pruning import WINDOW_S, checkpoints
from lbtune.search.tail import partial_figures, scored_figures
from lbtune.search.trial import Measurement, Samples, WindowHook
from lbtune.targets import get_target
from lbtune.targets.base import ParamSet
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace
from lbtune.tune.attained import with_attainment

__all__ = ["HarnessRequest", "StressMeasure", "WindowFeed", "plan_trials", "real_harness"]

log = logging.getLogger(__name__)


class HarnessRequest(Protocol):
    """What :func:`real_harness` reads of a study's options (:class:`lbtune.tune.optimize.
    OptimizeOptions`, resolved)."""

    @property
    def scenario(self) -> str | None: ...
    @property
    def target(self) -> str | None: ...
    @property
    def space(self) -> str | None: ...
    @property
    def trial_duration_s(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def slo(self) -> str | None: ...
    @property
    def state_dir(self) -> Path | None: ...
    @property
    def cluster_config(self) -> str | None: ...
    @property
    def inventory(self) -> str | None: ...
    @property
    def reports_root(self) -> Path: ...
    @property
    def window_s(self) -> float: ...
    @property
    def objective(self) -> str | None: ...
    @property
    def rate(self) -> float | None: ...


def plan_trials(opts: HarnessRequest) -> StressOptions:
    """The options every trial of a study runs with, their run plan made once: the one
    read of the scenario file in a study (the objective's SLO is this plan's too). Under
    the capacity objective the trials run open loop at ``opts.rate``, and the run's SLO is
    ``--slo`` without its TPOT bound (the objective judges that)."""
    assert opts.scenario is not None
    capacity = opts.objective == "capacity"
    sopts = StressOptions(
        scenario=opts.scenario,
        duration_s=opts.trial_duration_s,
        seed=opts.seed,
        rate=opts.rate if capacity else None,
        slo=without_tpot(opts.slo) if capacity else opts.slo,
        state_dir=opts.state_dir,
        cluster_config=opts.cluster_config,
        reports_root=opts.reports_root,
        write_report=False,
    )
    return replace(sopts, plan=plan_run(sopts))


def real_harness(
    opts: HarnessRequest,
    trials: StressOptions,
    runs_dir: Path,
    stop: threading.Event,
    say: Callable[[str], None],
    spec: ObjectiveSpec | None = None,
) -> Harness:
    """The embedded cluster (started if needed) or the running one in ``opts.state_dir``;
    every measurement runs ``trials`` (:func:`plan_trials`: their plan made once) and
    scores it under ``spec``."""
    assert opts.target is not None and trials.plan is not None
    # Bad input is refused before anything starts: resolving the target may bring the
    # embedded cluster up, which a typo in the space or scenario file must not leave behind
    # (the scenario was read when the plan was made).
    if opts.space:
        ParameterSpace.load(opts.space)
    resolved = resolve_target(trials, say)
    if resolved.endpoints is None:
        raise ConfigError("optimize needs a cluster lbtune manages (lbtune cluster up)")
    extra: dict[str, Any] = {"space_file": opts.space} if opts.space else {}
    endpoints = resolved.endpoints
    target = get_target(opts.target, endpoints, **extra)
    state_dir = Path(endpoints.state_dir)
    sopts = replace(trials, state_dir=state_dir)
    store = LkgStore(state_dir, target.name)
    space_file = Path(opts.space) if opts.space else None

    def lkg_get() -> ParamSet | None:
        found = store.get()
        return None if found is None else dict(found.params)

    def rollout_apply(params: ParamSet, source: str) -> object:
        return apply_params(
            target,
            params,
            via="ansible",
            inventory=opts.inventory,
            source=source,
            record=False,
            progress=say,
        )

    return Harness(
        target=target,
        measure=StressMeasure(sopts, runs_dir, opts.window_s, stop, spec),
        rollout_apply=rollout_apply,
        lkg_get=lkg_get,
        lkg_record=store.record,
        check_balancer=lambda: api.check_balancer(endpoints),
        lease=lambda: hold(state_dir, target.name, space_file=space_file),
        state_dir=state_dir,
    )


@dataclass
class StressMeasure:
    """A :class:`~lbtune.search.trial.Measure` backed by :func:`lbtune.run.stress.run_stress`."""

    options: StressOptions
    """Every trial's options, with their run plan (:func:`plan_trials`); ``out_dir`` is
    replaced per trial."""
    runs_dir: Path
    window_s: float = WINDOW_S
    interrupt: threading.Event = field(default_factory=threading.Event)
    """Set by Ctrl-C: stops the running measurement."""
    spec: ObjectiveSpec | None = None
    """The study's objective, where a trial's figures depend on it (capacity's SLO
    stretch and attainment)."""

    def __post_init__(self) -> None:
        if self.options.plan is None:
            raise ValueError("StressMeasure runs a plan made once: options.plan is unset")

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        opts = self.options
        assert opts.plan is not None
        out_dir = self.runs_dir / label
        out_dir.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        feed = WindowFeed(opts.plan, self.window_s, on_window)

        def on_progress(p: Progress) -> None:
            if self.interrupt.is_set() or feed(p):
                stop.set()

        t_start, wall = time.monotonic(), time.time()
        res = run_stress(
            replace(opts, out_dir=out_dir, write_report=False),
            on_progress=on_progress,
            stop=stop,
            say=lambda msg: log.debug("%s: %s", label, msg),
        )
        stopped = stop.is_set() or res.load.stopped_early
        m = _measurement(res, stopped, time.monotonic() - t_start, self.spec)
        m.extra["timing"] = _timing(res, wall, time.time())
        return m


class WindowFeed:
    """At each of the measured part's checkpoints (:func:`lbtune.search.pruning.
    checkpoints`: every ``window_s`` seconds, closer on a short window), the figures so
    far to ``on_window`` (from the records the run's one tail hands on with each
    snapshot); True when it asks to stop."""

    def __init__(self, plan: RunPlan, window_s: float, on_window: WindowHook | None) -> None:
        self._plan, self._on_window = plan, on_window
        self.offsets = checkpoints(plan.window_end_s - plan.window_start_s, window_s)
        """The checkpoints, seconds after the window's start (the same in every trial)."""
        self._records: list[RequestRecord] = []
        self._step = 1
        self.window: tuple[float, float] | None = None
        """The window as of the latest snapshot (:meth:`RunPlan.window_at` of the run's
        start as the runner knows it then)."""

    def __call__(self, p: Progress) -> bool:
        if self._on_window is None:
            return False
        self._records.extend(p.records)
        self.window = start, end = self._plan.window_at(p.started_at)
        at = p.started_at + p.elapsed_s  # this snapshot, on the runner's clock
        if self._step > len(self.offsets) or at - start < self.offsets[self._step - 1]:
            return False
        if at >= end:
            return False
        fig = partial_figures(self._records, start, end, now=p.now, open_requests=p.open_requests)
        if fig is None:  # nothing sent in the window as of the snapshot: next time
            return False
        this, self._step = self._step, self._step + 1
        return self._on_window(this, fig)


def _timing(res: StressResult, called: float, returned: float) -> dict[str, float]:
    """Where a trial's measurement spent its wall time (seconds): ``start`` (plan, target,
    the generator processes until they send), ``load`` (the planned length), ``drain``
    (past it: the last requests, the generators' exit, the records written) and
    ``summary`` (the figures, Prometheus's included)."""
    load = res.load
    planned = res.plan.load.duration_s
    ran = load.ended_at - load.started_at
    return {
        "start": round(load.started_at - called, 3),
        "load": round(min(ran, planned), 3),
        "drain": round(max(0.0, ran - planned), 3),
        "summary": round(returned - load.ended_at, 3),
    }


def _untrusted(health: GeneratorHealth, spec: ObjectiveSpec | None) -> tuple[str, ...]:
    """Why the generator's figures are not trusted for this study: every reason where its
    score reads TTFTs, else only the load's (a TTFT bound too wide for 15-ms TTFTs says
    nothing about an end-to-end score). The run's own health still says it all."""
    if spec is None or spec.reads_ttft:
        return health.reasons if health.degraded else ()
    return health.load_reasons


def _measurement(
    res: StressResult, stopped: bool, seconds: float, spec: ObjectiveSpec | None = None
) -> Measurement:
    """A trial's measurement from its run: the summary's figures with the censored
    samples' P99s (the one estimator) and the paired samples for the bootstrap."""
    summary = res.summary
    start, end = res.plan.measured()  # the window the run recorded (the summary's too)
    records = read_records(res.records_path)
    cs = censored_samples(records, start=start, end=end)
    figures: Figures | None
    try:
        figures = figures_from_summary(summary)
    except ValueError:
        if not stopped:
            raise
        figures = None
    if figures is not None:
        figures = scored_figures(figures, cs, spec)  # the one rule and the one estimator
        figures = with_attainment(figures, records, (start, end), spec)
    # Paired per request (the bootstrap resamples requests); a non-streamed request
    # has no TTFT: NaN, left out of the TTFT percentile. Nothing streamed: E2E stands in.
    # An error is a request as slow as the slowest (no config wins by refusing).
    ttfts, e2es = cs.scored()
    samples = Samples.of(
        ttfts if cs.streamed_ttft else e2es,
        e2es,
        sent=cs.sent,
        errors=cs.errors,
        tpot=cs.tpot + (math.nan,) * (len(e2es) - len(cs.e2e)) if cs.tpot else cs.tpot,
    )
    return Measurement(
        figures=figures,
        samples=samples,
        degraded=_untrusted(res.load.health, spec),
        stopped=stopped,
        seconds=seconds,
        plan=res.plan,
    )
