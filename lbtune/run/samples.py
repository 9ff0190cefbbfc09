"""Enough samples, up front: how many requests a planned run will hold in its window.

A P99 needs at least :data:`lbtune.records.quantiles.MIN_SAMPLES` ``["p99"]`` (100)
successful requests in the measurement window; with fewer it is not reported. Before a
run starts, ``lbtune stress`` says how many it expects and, when that is too few, what
to change::

    this run will hold ~37 requests in its 22 s window: too few for a P99 (100 needed);
    use --duration 80 or --until-samples 100

The estimate, by the run's loop:

* **open loop**: the planned send times in the window (exact: they are drawn from the
  seed), assuming the target keeps up;
* **closed loop**: the rate of successful requests per user that the latest indexed run
  of the same scenario against the same target **and the same balancer config** measured
  in its window (its ``run.json`` gives its users and the config it ran against), times
  this run's users and window. A run against another config is no evidence: in a closed
  loop the config sets the rate (round robin over a slow replica held 50 requests where
  the tuned config of the run before held ~300). Without such a run there is no
  estimate, and the message says so and points at ``--until-samples``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from lbtune.errors import ConfigError
from lbtune.history import db_path
from lbtune.history.store import HistoryStore
from lbtune.records.quantiles import MIN_SAMPLES
from lbtune.scenario.plan import LoadPlan
from lbtune.scenario.runplan import RunPlan, read_run_plan

__all__ = ["P99_SAMPLES", "Estimate", "describe_estimate", "estimate_window_requests"]

log = logging.getLogger(__name__)

P99_SAMPLES = MIN_SAMPLES["p99"]


@dataclass(frozen=True)
class Estimate:
    """Expected successful requests in the planned window, and at what rate."""

    requests: float
    rate_per_s: float
    """Successful requests per second in the window (for the shape's own window)."""
    basis: str


def mean_users(lp: LoadPlan, lo: float, hi: float, steps: int = 200) -> float:
    """Closed loop: the mean planned user count over ``[lo, hi)``."""
    if hi <= lo:
        return 0.0
    dt = (hi - lo) / steps
    return sum(lp.users_at(lo + (k + 0.5) * dt) for k in range(steps)) / steps


def estimate_window_requests(plan: RunPlan, reports_root: Path | None = None) -> Estimate | None:
    """How many successful requests ``plan`` will hold in its shape's window (None: unknown)."""
    lo, hi = plan.shape_window()
    lp = plan.load_plan()
    if lp.mode == "open":
        n = sum(1 for t in lp.arrivals if lo <= t < hi)
        return Estimate(float(n), n / (hi - lo), "planned send times")
    users = mean_users(lp, lo, hi)
    per_user = _history_rate_per_user(plan, reports_root)
    if per_user is None:
        return None
    rate, basis = per_user
    return Estimate(rate * users * (hi - lo), rate * users, basis)


def _history_rate_per_user(plan: RunPlan, reports_root: Path | None) -> tuple[float, str] | None:
    """Successful requests/s per user of the latest indexed run like this one."""
    path = db_path(reports_root=reports_root)
    if path is None or not path.is_file():
        return None
    try:
        entries = HistoryStore(path).entries(scenario=plan.scenario_name, last=20)
    except Exception as exc:  # an unreadable index is no estimate, never a failed run
        log.debug("samples: history not read (%s)", exc)
        return None
    for e in reversed(entries):
        fig = e.figures.get("run")
        if e.kind != "stress" or fig is None or e.report_dir is None:
            continue
        if plan.target.url is not None and e.target != plan.target.url:
            continue
        if not fig.completed or fig.window_start_s is None or fig.window_end_s is None:
            continue
        try:
            past = read_run_plan(e.report_dir)
        except ConfigError:
            continue
        if past.load.mode != "closed" or not _same_config(plan, past):
            continue
        users = mean_users(past.load_plan(), fig.window_start_s, fig.window_end_s)
        span = fig.window_end_s - fig.window_start_s
        if users <= 0 or span <= 0:
            continue
        rate = fig.completed / span / users
        return rate, f"run {Path(e.report_dir).name}: {fig.completed / span:.2f} req/s"
    return None


def _same_config(plan: RunPlan, past: RunPlan) -> bool:
    """Whether ``past`` ran against the balancer config ``plan`` runs against (unknown on
    both sides counts as the same: a target lbtune does not manage)."""
    return plan.target.params == past.target.params


def duration_for(plan: RunPlan, need: float, rate_per_s: float) -> float:
    """A ``--duration`` whose window should hold ``need`` requests at ``rate_per_s``
    (20 % to spare, rounded up to 10 s), warm-up and cool-down as plan_load sizes them."""
    sc = plan.scenario
    window = need * 1.2 / rate_per_s
    full = sc.duration_s - sc.warmup_s - sc.cooldown_s
    # Shorter than the scenario: warm-up and cool-down shrink in proportion; longer: fixed.
    d = window * sc.duration_s / full if window <= full else window + sc.warmup_s + sc.cooldown_s
    return float(10 * math.ceil(d / 10))


def describe_estimate(plan: RunPlan, est: Estimate | None, need: int = P99_SAMPLES) -> str:
    """The line ``lbtune stress`` prints before the run starts."""
    lo, hi = plan.shape_window()
    span = hi - lo
    until = plan.load.until_samples
    if until is not None:
        bound = f"at most {plan.load.duration_s:g} s (--max-duration)"
        if est is None or est.rate_per_s <= 0:
            return f"--until-samples {until}: runs until its window holds {until} requests, {bound}"
        after = max(span, until / est.rate_per_s)
        return (
            f"--until-samples {until}: runs until its window holds {until} requests "
            f"(expected after ~{after + lo:.0f} s), {bound}"
        )
    if est is None:
        return (
            f"no estimate of the requests this run's {span:.0f} s window will hold (closed loop, "
            f"and no earlier run of {plan.scenario_name} against this target and its current "
            "balancer config to go by); "
            f"--until-samples {need} makes sure of a P99"
        )
    n = round(est.requests)
    if n >= need:
        return f"this run will hold ~{n} requests in its {span:.0f} s window: enough for a P99"
    hint = f"--until-samples {need}"
    if est.rate_per_s > 0:
        hint = f"--duration {duration_for(plan, need, est.rate_per_s):g} or {hint}"
    return (
        f"this run will hold ~{n} requests in its {span:.0f} s window: too few for a P99 "
        f"({need} needed; estimate from {est.basis}); use {hint}"
    )


def after_run_hint(plan: RunPlan, ok: int, window_s: float, need: int = P99_SAMPLES) -> str | None:
    """After a run whose window held ``ok`` < ``need`` successful requests: what to pass
    next time, sized from the rate this run measured (``None`` when it held enough)."""
    if ok >= need:
        return None
    hint = f"--until-samples {need}"
    if ok > 0 and window_s > 0 and plan.load.until_samples is None:
        hint = f"--duration {duration_for(plan, need, ok / window_s):g} or {hint}"
    return (
        f"the window held {ok} successful requests: too few for a P99 ({need} needed); "
        f"next time use {hint}"
    )
