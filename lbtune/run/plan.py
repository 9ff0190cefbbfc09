"""The plan of one run, made from its options: reads the scenario once, nothing else.

The plan is recorded as ``run.json`` (:mod:`lbtune.scenario.runplan`) and every later
step (the generators, the summary, reports, ``compare``) reads it from there.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import ValidationError

from lbtune.errors import ConfigError, validation_error
from lbtune.records.slo import Slo, parse_slo
from lbtune.scenario.loader import load_scenario
from lbtune.scenario.plan import Stage, default_duration, plan_load
from lbtune.scenario.runplan import LoadSpec, RunPlan, SloSpec, StageSpec, TargetSpec

__all__ = ["DEFAULT_MAX_DURATION_S", "RunRequest", "plan_run"]

DEFAULT_MAX_DURATION_S = 600.0
"""``--until-samples`` without ``--max-duration``: the longest such a run may last."""


def _stage_spec(s: Stage) -> StageSpec:
    return StageSpec(
        start_s=s.start_s,
        end_s=s.end_s,
        users=s.users,
        rate=s.rate,
        label=s.label,
        ramp_from=s.ramp_from,
    )


class RunRequest(Protocol):
    """What :func:`plan_run` reads of a run's options (:class:`lbtune.run.stress.StressOptions`)."""

    @property
    def plan(self) -> RunPlan | None: ...
    @property
    def scenario(self) -> str: ...
    @property
    def duration_s(self) -> float | None: ...
    @property
    def max_duration_s(self) -> float | None: ...
    @property
    def until_samples(self) -> int | None: ...
    @property
    def users(self) -> int | None: ...
    @property
    def rate(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def slo(self) -> str | None: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def target_url(self) -> str | None: ...


def plan_run(opts: RunRequest) -> RunPlan:
    """The plan of a run with ``opts``: reads the scenario once, nothing else. A plan out of
    the bounds of :class:`RunPlan` (the options scaling the scenario beyond them) is one
    ConfigError line."""
    if opts.plan is not None:
        return opts.plan
    try:
        return _plan(opts)
    except ValidationError as exc:
        raise validation_error(exc, "the run plan", RunPlan) from None


def _plan(opts: RunRequest) -> RunPlan:
    scenario = load_scenario(opts.scenario)
    until = opts.until_samples
    if until is not None and until < 1:
        raise ConfigError(f"--until-samples: must be >= 1, got {until}")
    hold: float | None = None
    shape_s = default_duration(scenario) if opts.duration_s is None else float(opts.duration_s)
    if until is not None:
        hold = max(shape_s, opts.max_duration_s or DEFAULT_MAX_DURATION_S)
    elif opts.max_duration_s is not None:
        raise ConfigError("--max-duration bounds --until-samples; give both, or use --duration")
    seed = scenario.seed if opts.seed is None else opts.seed
    lp = plan_load(scenario, shape_s, opts.users, opts.rate, seed, hold)
    base = Slo(
        ttft_s=scenario.slo.ttft if scenario.slo else None,
        e2e_s=scenario.slo.e2e if scenario.slo else None,
    )
    slo = parse_slo(opts.slo, base)
    lo, hi = lp.measure_window
    load = LoadSpec(
        mode=lp.mode,
        duration_s=lp.duration_s,
        shape_duration_s=shape_s,
        users=opts.users,
        rate=opts.rate,
        stages=tuple(_stage_spec(s) for s in lp.stages),
        warmup_s=lp.warmup_s,
        cooldown_s=lp.cooldown_s,
        arrival=lp.arrival,
        cv=lp.cv,
        arrivals=len(lp.arrivals),
        until_samples=until,
    )
    return RunPlan(
        scenario_ref=str(opts.scenario),
        scenario_name=scenario.name,
        scenario=scenario,
        seed=seed,
        tokenizer=opts.tokenizer,
        load=load,
        window_start_s=lo,
        window_end_s=hi,
        slo=SloSpec(ttft_s=slo.ttft_s, e2e_s=slo.e2e_s, max_error_rate=slo.max_error_rate),
        target=TargetSpec(url=None if opts.target_url is None else opts.target_url.rstrip("/")),
    )
