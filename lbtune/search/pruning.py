"""Pruning: stop a clearly bad trial after a few measurement windows.

Each trial reports, at its **checkpoints** (:func:`checkpoints`: every ``window_s``
seconds of its measured part, closer together on a short window so that at least two fall
inside it), the composite score of the requests measured so far (cumulative, so later
windows are steadier). Windows are numbered from 1. :func:`pruning_line` says at the
start of a study what the pruner will be able to do with the study's trial length.
The score is **censored** like the final one: a request still running at the
checkpoint counts at the time it has been running (see
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
WINDOW_S = 5.0
"""Seconds between checkpoints on a window long enough for them."""
SNAPSHOT_S = 1.0
"""The load runner's progress cadence: the last checkpoint is this far before the
window's end, so that a snapshot falls between them."""
MIN_SPACING_S = 1.5
"""Closer checkpoints than this hold too few new requests to tell anything: pruning
cannot act on a window too short for ``WARMUP_WINDOWS + 1`` of them."""
INTERVAL_ATTR = "intermediate_interval"
"""Trial user attribute: ``{str(window): [low, high]}`` of the intermediate scores."""


def should_prune(low: float, others: Sequence[float]) -> bool:
    """True when ``low`` (the trial's score interval's low end) is above the median of
    ``others`` (the completed trials' scores at the same window)."""
    return bool(others) and low > percentile(others, 50)


def checkpoints(
    window_len: float, window_s: float = WINDOW_S, warmup_windows: int = WARMUP_WINDOWS
) -> tuple[float, ...]:
    """Offsets from the window's start of a trial's checkpoints: every ``window_s``
    seconds, or closer on a short window so that ``warmup_windows + 1`` of them (the
    first one that may prune) fall at least :data:`SNAPSHOT_S` before its end; none
    closer than :data:`MIN_SPACING_S` (then pruning cannot act: :func:`pruning_line`).

    A default 25 s ``mixed`` trial (18.75 s measured): 5, 10, 15 s; a 15 s one (11.25 s):
    5, 10 s; a 10 s window: 4.5, 9 s (at every 5 s, its second fell on the end)."""
    room = window_len - SNAPSHOT_S
    spacing = min(window_s, room / (warmup_windows + 1))
    if spacing < MIN_SPACING_S:
        spacing = MIN_SPACING_S
    n = int(room / spacing + 1e-9)
    return tuple(round(spacing * k, 6) for k in range(1, n + 1))


def pruning_line(
    name: str,
    window_len: float,
    *,
    multi_objective: bool = False,
    window_s: float = WINDOW_S,
    n_references: int = 0,
) -> str:
    """What the pruner can do in this study, in one line (said at its start)."""
    if name == "none":
        return "pruning off (--pruner none): every trial runs whole"
    if multi_objective:
        return "pruning off: Optuna cannot prune a multi-objective (pareto) study"
    at = checkpoints(window_len, window_s)
    if len(at) <= WARMUP_WINDOWS:
        return (
            f"pruning cannot act: each trial's measured window is {window_len:.1f} s, too short "
            f"for {WARMUP_WINDOWS + 1} checkpoints {MIN_SPACING_S:g} s apart (the first is never "
            "pruned); every trial runs whole — a longer --trial-duration lets it act"
        )
    shown = ", ".join(f"{x:g}" for x in at)
    return (
        f"pruning: checkpoints at {shown} s of each trial's {window_len:.1f} s window; from "
        f"checkpoint {WARMUP_WINDOWS + 1} a trial whose score interval lies above the median "
        f"is stopped, once the {n_references} reference(s) and 2 sampled trials completed"
    )


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
