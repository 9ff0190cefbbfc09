"""What one virtual run leaves: its records, and the figures computed from them exactly as
a live run's are (the run plan's window, :func:`lbtune.metrics.stats.summarize`,
:func:`lbtune.metrics.censor.censored_samples`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lbtune.metrics.censor import CensoredSamples, censored_samples
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import RunSummary, Window
from lbtune.records.requests import RequestRecord
from lbtune.scenario.runplan import RunPlan
from lbtune.sim.engine import Engine

__all__ = ["TwinRun"]


@dataclass(frozen=True)
class TwinRun:
    """One virtual run: every request's record (times in seconds from the run's start)."""

    records: tuple[RequestRecord, ...]
    plan: RunPlan
    ended_at: float
    """When the run ended: the drain's end, at most the duration plus the grace."""
    unmodeled: tuple[str, ...] = ()
    """Knobs of the params the routing model did not reproduce."""
    cpu_s: float = 0.0
    """CPU seconds the simulation took."""
    events: int = 0
    replica_busy_s: dict[str, float] = field(default_factory=dict)
    replica_steps: dict[str, int] = field(default_factory=dict)
    run_start: float = 0.0
    engines: dict[str, Engine] = field(default_factory=dict, repr=False, compare=False)
    """The replicas' engines as the run left them (idle, their prefix caches warm): pass
    them to the next :func:`~lbtune.twin.run.simulate` to continue on the same cluster."""

    @property
    def virtual_s(self) -> float:
        return self.ended_at - self.run_start

    @property
    def window(self) -> Window:
        """The plan's measurement window, cut at the run's end (as a live summary does)."""
        start, end = self.plan.window_at(self.run_start)
        end = min(end, self.ended_at)
        return Window(start, max(start, end))

    def notes(self) -> tuple[str, ...]:
        out = ["virtual-time twin: figures are simulated, not measured"]
        if self.unmodeled:
            out.append("not modeled by the twin: " + ", ".join(self.unmodeled))
        return tuple(out)

    def summary(self, target: str = "twin") -> RunSummary:
        """The run's :class:`RunSummary` (client side only), as ``lbtune stress`` computes it."""
        return summarize(
            list(self.records),
            run_start=self.run_start,
            window=self.window,
            scenario=self.plan.scenario_name,
            target=target,
            slo=self.plan.slo_value(),
            stages=self.plan.stages(),
            notes=self.notes(),
        )

    def censored(self) -> CensoredSamples:
        """The window's censored samples (what a study's trial scores)."""
        w = self.window
        return censored_samples(self.records, start=w.start, end=w.end)
