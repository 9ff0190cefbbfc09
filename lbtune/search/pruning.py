"""Pruning: stop a clearly bad trial after a few measurement windows.

Each trial reports, every ``window_s`` seconds of its measured part, the composite
score of the requests measured so far (cumulative, so later windows are steadier).
Windows are numbered from 1. The score is **censored** like the final one: a request
still running at the checkpoint counts at the time it has been running (see
:mod:`lbtune.search.tail`), so a configuration whose slow requests have not
finished does not look good mid-trial. Because every trial replays the same seeded
traffic, window *k* of one trial is comparable with window *k* of another.

The rule (:func:`should_prune`): at window *k*, a trial is stopped when the **low end
of its score's 95 % interval** (:func:`lbtune.objective.composite_interval`, from the
P99s' bootstrap intervals) is above the **median** of the completed trials' scores at
window *k*. A trial whose interval reaches the median is let run: with ~100 requests
a P99 is close to the sample maximum and one window's score is not evidence.
Pruning waits until the references and two sampled trials have completed
(``n_startup_trials``), and **never happens on the first** ``warmup_windows``
**windows** of a trial (default 1: window 1, the fewest samples, is never pruned).

Median rather than Wilcoxon: a default trial has only 2–3 windows, too few for a
signed-rank test to ever reach significance (n = 3 gives p >= 0.25), and Optuna's
``WilcoxonPruner`` needs SciPy, which lbtune does not otherwise depend on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from lbtune.errors import ConfigError
from lbtune.objective import Figures, ObjectiveSpec, composite, composite_interval
from lbtune.records.quantiles import percentile

if TYPE_CHECKING:
    import optuna

PrunerName = Literal["median", "none"]
PRUNERS: tuple[PrunerName, ...] = ("median", "none")
WARMUP_WINDOWS = 1
"""Windows 1..WARMUP_WINDOWS of a trial are never pruned."""
INTERVAL_ATTR = "intermediate_interval"
"""Trial user attribute: ``{str(window): [low, high]}`` of the intermediate scores."""


def should_prune(low: float, others: Sequence[float]) -> bool:
    """True when ``low`` (the trial's score interval's low end) is above the median of
    ``others`` (the completed trials' scores at the same window)."""
    return bool(others) and low > percentile(others, 50)


def make_pruner(
    name: str,
    *,
    n_references: int,
    multi_objective: bool = False,
    warmup_windows: int = WARMUP_WINDOWS,
) -> optuna.pruners.BasePruner:
    """The study's pruner (see the module docstring); ``none`` and pareto mode get
    ``NopPruner`` (Optuna cannot prune multi-objective studies)."""
    import optuna

    if name not in PRUNERS:
        raise ConfigError(f"Unknown pruner {name!r}. Available: {', '.join(PRUNERS)}")
    if name == "none" or multi_objective:
        return optuna.pruners.NopPruner()
    return _pruner_class()(n_startup_trials=n_references + 2, warmup_windows=warmup_windows)


def interval_low(trial: optuna.trial.FrozenTrial, step: int) -> float:
    """The low end of the trial's score interval at ``step`` (its score when none)."""
    value = float(trial.intermediate_values[step])
    found: Mapping[str, Any] = trial.user_attrs.get(INTERVAL_ATTR) or {}
    ci = found.get(str(step))
    return value if ci is None else min(value, float(ci[0]))


@functools.cache
def _pruner_class() -> Callable[..., optuna.pruners.BasePruner]:
    import optuna
    from optuna.trial import TrialState

    class IntervalMedianPruner(optuna.pruners.BasePruner):
        """Median of completed trials at the same window vs this trial's interval low end."""

        def __init__(self, n_startup_trials: int, warmup_windows: int) -> None:
            self.n_startup_trials = n_startup_trials
            self.warmup_windows = warmup_windows

        def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
            step = trial.last_step
            if step is None or step <= self.warmup_windows:
                return False
            done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if len(done) < self.n_startup_trials:
                return False
            others = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
            return should_prune(interval_low(trial, step), others)

    return IntervalMedianPruner


def window_value(fig: Figures, spec: ObjectiveSpec) -> float:
    """The intermediate value of one window: the composite score so far (decay excluded,
    as it needs the whole run)."""
    return composite(fig, spec)


def window_interval(fig: Figures, spec: ObjectiveSpec) -> tuple[float, float] | None:
    """The intermediate value's interval (see :func:`lbtune.objective.composite_interval`)."""
    return composite_interval(fig, spec)
