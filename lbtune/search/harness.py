"""What a study runs against — target, measurement, rollout path, last known good — and
the safe rollout of a confirmed winner.

:func:`lbtune.tune.harness.real_harness` wires the real pieces (the embedded cluster
or a running one, ``run_stress``, ``apply_params(via="ansible")``, the LKG store); tests
pass a :class:`Harness` of fakes to :func:`lbtune.tune.optimize.run_optimize` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbtune.errors import LbtuneError, TrialFailed
from lbtune.objective import ObjectiveSpec, feasible
from lbtune.search.judge import bootstrap_diff
from lbtune.search.result import Confirmation, Rollout
from lbtune.search.trial import Measure
from lbtune.targets.base import ParamSet
from lbtune.targets.targetbase import TargetBase

log = logging.getLogger(__name__)


@dataclass
class Harness:
    target: TargetBase
    measure: Measure
    rollout_apply: Callable[[ParamSet, str], object]
    """Apply a parameter set through the rollout path (Ansible), without recording LKG."""
    lkg_get: Callable[[], ParamSet | None]
    lkg_record: Callable[[ParamSet, str], object]
    rollout_via: str = "ansible"
    check_balancer: Callable[[], None] = lambda: None
    """Raise :class:`~lbtune.errors.BalancerDown` if the balancer's process is gone."""
    lease: Callable[[], Callable[[], None]] = lambda: lambda: None
    """Take the lease on the live balancer (:func:`lbtune.apply.lease.hold`: its guard
    restores the last known good if this process dies); returns the release."""
    state_dir: Path | None = None
    """The embedded cluster's state directory (its recorded config is the twin's, for
    screening); ``None``: no twin."""


def rollout(
    h: Harness,
    params: ParamSet,
    previous: ParamSet,
    confirmation: Confirmation,
    spec: ObjectiveSpec,
    study: str,
    say: Callable[[str], None],
) -> Rollout:
    """Apply the winner through the rollout path, verify it, roll back when it is worse.

    Worse = the verification run fails the constraints, cannot be measured, or its
    score is above the baseline's with a bootstrap CI that excludes zero.
    The winner becomes the last known good only once verified.
    """
    source = f"study:{study}#{confirmation.winner}"
    try:
        h.rollout_apply(params, source)
    except LbtuneError as exc:
        return Rollout(applied=False, via=h.rollout_via, detail=f"rollout failed: {exc}")
    say("verification run of the applied winner")
    problem, fig, diff, ci = None, None, None, None
    try:
        m = h.measure("verify", None)
        fig = m.figures
        if m.degraded:
            problem = "the load generator fell behind during verification"
        elif fig is None or m.samples is None:
            problem = "verification was not measurable"
        elif not feasible(fig, spec):
            problem = f"verification error rate {fig.error_rate:.2%} exceeds the limit"
        else:
            # Not paired (the baseline cannot run while the winner is live): the
            # verification run against the baseline's confirmation runs, same tail.
            d, lo, hi = bootstrap_diff(
                [m.samples], list(confirmation.baseline_samples), spec, q=confirmation.quantile
            )
            diff, ci = d, (lo, hi)
            if lo > 0:
                problem = (
                    "verification is worse than the baseline beyond the noise "
                    f"({d:+.3f}, CI {lo:+.3f}..{hi:+.3f})"
                )
    except (TrialFailed, LbtuneError, ValueError) as exc:
        problem = f"verification failed: {exc}"
    if problem is None:
        h.lkg_record(params, source)
        return Rollout(True, h.rollout_via, True, False, "applied and verified", fig, diff, ci)
    say(f"{problem}: rolling back to the last known good")
    try:
        h.rollout_apply(previous, f"rollback after {source}")
        detail = f"{problem}; rolled back to the last known good"
    except LbtuneError as exc:
        detail = f"{problem}; the rollback failed too: {exc}"
    return Rollout(True, h.rollout_via, False, True, detail, fig, diff, ci)
