"""A study's measurement in virtual time, for tests of the search itself.

Why not live: what these tests check is the study's logic (its pruner, the checkpoints it
is shown, the region it reaches), not the balancer, and a live study of a few trials costs
minutes of the suite's time. The twin runs the same plan against the same simulated
replicas and leaves the records a live run would (:mod:`lbtune.twin`), and a checkpoint
here is computed by the function the live one calls (:func:`lbtune.search.tail.
partial_figures`) from the records as they stood at that moment. Live studies stay in
``tests/tune/test_optimize_e2e.py`` and ``tests/targets/test_optimize_targets.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lbtune.cluster.twin import TwinCluster, twin_params
from lbtune.objective import figures_from_summary
from lbtune.scenario.runplan import RunPlan
from lbtune.search.pruning import checkpoints
from lbtune.search.tail import partial_figures, scored_figures
from lbtune.search.trial import Measurement, Samples, WindowHook
from lbtune.twin.requests import RequestSource
from lbtune.twin.result import TwinRun
from lbtune.twin.run import Reuse, simulate
from tests.search.fakes import FakeTarget


@dataclass
class TwinMeasure:
    """Runs ``plan`` on the twin of ``tc`` with what ``target`` has live (over the
    balancer's baseline): a :class:`~lbtune.search.trial.Measure`."""

    target: FakeTarget
    tc: TwinCluster
    plan: RunPlan
    window_s: float
    runs: dict[str, TwinRun] = field(default_factory=dict)
    """Each label's run, whole (also when the study stopped it at a checkpoint)."""

    def __post_init__(self) -> None:
        self._source = RequestSource(self.plan, self.tc.options().host_seed)
        self._knobs = twin_params(self.tc)[0]

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        params = {**self._knobs, **self.target.live}
        run = simulate(
            self.plan, self.tc.replicas, self.tc.routing(params), self.tc.options(),
            Reuse(self._source),
        )  # fmt: skip
        self.runs[label] = run
        stopped = on_window is not None and self._stopped_at_a_checkpoint(run, on_window)
        cs = run.censored()
        figures = scored_figures(figures_from_summary(run.summary()), cs)
        ttfts, e2es = cs.scored()
        samples = Samples.of(
            ttfts if cs.streamed_ttft else e2es, e2es, sent=cs.sent, errors=cs.errors
        )
        return Measurement(figures, samples, stopped=stopped, plan=self.plan)

    def _stopped_at_a_checkpoint(self, run: TwinRun, on_window: WindowHook) -> bool:
        """The live feed's rule (:class:`lbtune.tune.harness.WindowFeed`): at each
        checkpoint inside the window, the figures so far; True when the study stops it."""
        start, end = run.window.start, run.window.end
        step = 1
        for offset in checkpoints(self.plan.window_end_s - self.plan.window_start_s, self.window_s):
            now = start + offset
            if now >= end:
                break
            fig = partial_figures(list(run.records), start, end, now=now)
            if fig is None:
                continue
            if on_window(step, fig):
                return True
            step += 1
        return False
