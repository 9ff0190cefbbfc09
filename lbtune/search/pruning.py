"""Pruning: stop a clearly bad trial after a few measurement windows.

Each trial reports, every ``window_s`` seconds of its measured part, the composite
score of the requests measured so far (cumulative, so later windows are steadier).
Because every trial replays the same seeded traffic, window *k* of one trial is
comparable with window *k* of another, which is what Optuna's ``MedianPruner``
compares: a trial is stopped when its score at window *k* is worse than the median
of the earlier trials' scores at window *k*.

Median rather than Wilcoxon: a default trial has only 2–3 windows, too few for a
signed-rank test to ever reach significance (n = 3 gives p >= 0.25), and Optuna's
``WilcoxonPruner`` needs SciPy, which lbtune does not otherwise depend on. The
measurement that it saves time without losing the winner is in
``benchmarks/tuner_efficiency.py --pruning`` and ``docs/optimize.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lbtune.errors import ConfigError
from lbtune.objective import Figures, ObjectiveSpec, composite

if TYPE_CHECKING:
    import optuna

PrunerName = Literal["median", "none"]
PRUNERS: tuple[PrunerName, ...] = ("median", "none")


def make_pruner(
    name: str, *, n_references: int, multi_objective: bool = False
) -> optuna.pruners.BasePruner:
    """The study's pruner: never before the references and two sampled trials completed.

    ``n_warmup_steps=1`` keeps the first window (the fewest samples) from pruning.
    Optuna cannot prune multi-objective studies, so pareto mode gets ``NopPruner``.
    """
    import optuna

    if name not in PRUNERS:
        raise ConfigError(f"Unknown pruner {name!r}. Available: {', '.join(PRUNERS)}")
    if name == "none" or multi_objective:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(
        n_startup_trials=n_references + 2, n_warmup_steps=1, interval_steps=1
    )


def window_value(fig: Figures, spec: ObjectiveSpec) -> float:
    """The intermediate value of one window: the composite score so far (decay excluded,
    as it needs the whole run)."""
    return composite(fig, spec)
