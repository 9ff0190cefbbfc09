"""A fitted twin against live runs it did not see (``lbtune twin fit``'s validation).

``runs`` live runs of a scenario through the balancer at its current config, each its
own seed, and the fitted twin on each run's recorded plan: ``|twin / live − 1|`` of P99
E2E, P99 TTFT and req/s, and how far the live runs differed among themselves. The profile
keeps it; :meth:`~lbtune.twin.fitted.TwinProfile.trusted` says whether screening may use it.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbtune.cluster import api
from lbtune.cluster.twin import drop_inactive, running_twin
from lbtune.errors import ConfigError
from lbtune.objective import Figures
from lbtune.records.endpoints import Endpoints
from lbtune.run.stress import StressOptions, run_stress
from lbtune.scenario.loader import load_scenario
from lbtune.scenario.runplan import read_run_plan
from lbtune.targets import get_target
from lbtune.tune.twincheck import METRICS, live_figures
from lbtune.tune.virtual import twin_figures
from lbtune.twin.fitted import TwinProfile, Validation
from lbtune.twin.requests import RequestSource
from lbtune.twin.run import Reuse, simulate

__all__ = ["ValidationPlan", "check_scenario", "validate_profile"]

Say = Callable[[str], None]
VALIDATION_SAMPLES = 100
"""A validation run goes on past its duration until its window holds this many requests
(a P99 of fewer is their largest one), up to :data:`VALIDATION_MAX_S`."""
VALIDATION_MAX_S = 90.0


@dataclass(frozen=True)
class ValidationPlan:
    scenario: str = "chat"
    duration_s: float = 30.0
    runs: int = 2
    """Live runs (each its own seed)."""
    seed: int | None = None


def check_scenario(scenario: str, ep: Endpoints) -> None:
    """Before any load: the validation scenario asks only for models the fit covers (a
    replica is fitted for its first model)."""
    fitted = {r.models[0] for r in ep.replicas if r.models}
    missing = sorted(set(load_scenario(scenario).models) - fitted)
    if missing:
        raise ConfigError(
            f"--scenario {scenario} uses {', '.join(missing)}, which the fit does not cover "
            f"(a replica is fitted for its first model: {', '.join(sorted(fitted))}); "
            "validate with a scenario of those (e.g. chat)"
        )


def validate_profile(
    profile: TwinProfile, plan: ValidationPlan, state_dir: str | Path, say: Say
) -> Validation:
    """``plan.runs`` live runs of ``plan.scenario`` at the balancer's current config (each
    its own seed), and the fitted twin on each run's recorded plan: the figures' means,
    the twin's relative error on them and how far the live runs differed among themselves."""
    tc = running_twin(state_dir, profile)
    ep = api.status(state_dir).endpoints
    if ep is None:
        raise ConfigError("twin fit: the cluster stopped before its validation")
    params = drop_inactive(tc, get_target(tc.balancer, ep).read_live())[0]
    lives: list[Figures] = []
    twins: list[Figures] = []
    seed = plan.seed
    for i in range(plan.runs):
        say(f"validation run {i + 1}/{plan.runs}: {plan.scenario} for {plan.duration_s:g} s")
        with tempfile.TemporaryDirectory(prefix="lbtune-twin-fit-") as tmp:
            run_dir = Path(tmp) / "live"
            sopts = StressOptions(
                scenario=plan.scenario,
                duration_s=plan.duration_s,
                seed=seed,
                state_dir=Path(state_dir),
                out_dir=run_dir,
                write_report=False,
                until_samples=VALIDATION_SAMPLES,  # a P99 of 30 requests is their maximum
                max_duration_s=VALIDATION_MAX_S,
            )
            run_stress(sopts, say=lambda m: None)
            lives.append(live_figures(run_dir)[0])
            ran = read_run_plan(run_dir)
        seed = ran.seed + 1
        src = RequestSource(ran, tc.config.seed)
        run = simulate(src.plan, tc.replicas, tc.routing(params), tc.options(), Reuse(src, None))
        twins.append(twin_figures(run)[0])
    live = {m: _mean([getattr(f, m) for f in lives]) for m in METRICS}
    twin = {m: _mean([getattr(f, m) for f in twins]) for m in METRICS}
    errors = {m: abs(t / v - 1) for m in METRICS if (t := twin[m]) is not None and (v := live[m])}
    spread: dict[str, float] = {}
    for m in METRICS:
        vals = [x for f in lives if (x := getattr(f, m))]
        if len(vals) >= 2:
            spread[m] = max(vals) / min(vals) - 1
    return Validation(
        scenario=plan.scenario,
        duration_s=plan.duration_s,
        runs=plan.runs,
        live=live,
        twin=twin,
        errors=errors,
        live_spread=spread,
    )


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if len(vals) == len(xs) and vals else None
