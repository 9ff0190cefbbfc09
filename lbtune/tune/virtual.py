"""Virtual trials: a twin run scored as a study scores a live trial.

:func:`twin_figures` gives a :class:`~lbtune.twin.result.TwinRun` (or a recorded live run
wrapped as one) the figures and composite score a study trial would get: the summary's
figures with the censored samples' P99s (:func:`lbtune.search.tail.scored_figures`, the
function the live measurement uses) and :func:`lbtune.objective.composite` under the
plan's SLO. :class:`VirtualBench` runs many parameter sets of one plan on a cluster's twin,
on every core (:class:`~lbtune.twin.pool.TwinPool`): what ``optimize``'s screening stage
and ``lbtune twin check`` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from lbtune.cluster.twin import TwinCluster
from lbtune.objective import Figures, ObjectiveSpec, figures_from_summary, score
from lbtune.scenario.runplan import RunPlan
from lbtune.search.tail import scored_figures
from lbtune.targets.params import ParamSet
from lbtune.tune.attained import with_attainment
from lbtune.tune.options import objective_spec
from lbtune.twin.options import TwinOptions
from lbtune.twin.pool import TwinJob, TwinPool
from lbtune.twin.result import TwinRun

__all__ = ["Predicted", "VirtualBench", "twin_figures"]


def twin_figures(run: TwinRun, spec: ObjectiveSpec | None = None) -> tuple[Figures, float]:
    """A study trial's figures of ``run`` and its score (under ``spec``, else the default
    composite over the plan's SLO). ValueError when nothing in the window ended."""
    spec = spec or objective_spec("composite", run.plan.slo_value(), None)
    fig = scored_figures(figures_from_summary(run.summary()), run.censored(), spec)
    w = run.window
    fig = with_attainment(fig, run.records, (w.start, w.end), spec)
    return fig, score(fig, spec)


@dataclass(frozen=True)
class Predicted:
    """The twin's figures of one parameter set (``None`` when the run had none)."""

    params: ParamSet
    figures: Figures | None
    score: float | None
    """The composite score (lower is better); ``None`` without figures."""
    unmodeled: tuple[str, ...] = ()
    cpu_s: float = 0.0


class VirtualBench:
    """One plan on one cluster's twin, many parameter sets, every core.

    ``with VirtualBench(tc, plan, spec) as bench: bench.run([params, ...])``."""

    def __init__(
        self,
        tc: TwinCluster,
        plan: RunPlan,
        spec: ObjectiveSpec,
        options: TwinOptions | None = None,
        workers: int | None = None,
    ) -> None:
        self.tc, self.plan, self.spec = tc, plan, spec
        self.options = options or tc.options()
        self._pool = TwinPool(workers)

    @property
    def workers(self) -> int:
        return self._pool.workers

    def __enter__(self) -> VirtualBench:
        self._pool.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.__exit__(exc_type, exc, tb)

    def run(self, batch: Sequence[ParamSet], seed: int = 0) -> list[Predicted]:
        """Each parameter set simulated (the routing model seeded with ``seed``) and scored."""
        jobs = [
            TwinJob(
                self.plan,
                tuple(self.tc.replicas),
                self.tc.factory(),
                params,
                self.options,
                seed=seed,
            )
            for params in batch
        ]
        return [self._score(p, run) for p, run in zip(batch, self._pool.map(jobs), strict=True)]

    def _score(self, params: ParamSet, run: TwinRun) -> Predicted:
        try:
            fig, score = twin_figures(run, self.spec)
        except ValueError:  # nothing ended in the window: no figures, as a live run
            return Predicted(dict(params), None, None, run.unmodeled, run.cpu_s)
        return Predicted(dict(params), fig, score, run.unmodeled, run.cpu_s)
