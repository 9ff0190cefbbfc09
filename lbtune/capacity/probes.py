"""The probes of a capacity search: a live stress run, or a twin run, at one offered rate.

A live probe is an ordinary load test (:func:`lbtune.run.stress.run_stress`, open loop at
the rate, the scenario's shape otherwise) with its run directory and records; its
attainment is computed from those records (:mod:`lbtune.capacity.attainment`), and the
generator's health comes from its summary: a probe whose generator fell behind says why
(:attr:`~lbtune.capacity.search.ProbeResult.behind`), and the search redoes it or stops.

A twin probe is the same plan simulated in virtual time (:func:`lbtune.twin.run.simulate`):
seconds of CPU instead of a minute of traffic, used to place the live search's bracket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from lbtune.capacity.attainment import attainment
from lbtune.capacity.search import ProbeLatency, ProbeResult
from lbtune.loadgen.recordio import read_records
from lbtune.metrics.summary import Latencies
from lbtune.records.slo import Slo
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions, run_stress
from lbtune.scenario.runplan import RunPlan
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import RoutingModel
from lbtune.twin.run import simulate

__all__ = ["LiveProbe", "ProbeShape", "Probes", "TwinCase", "TwinProbe", "latency", "probe_dir"]

log = logging.getLogger(__name__)


def probe_dir(root: Path, index: int, rate: float) -> Path:
    """The run directory of a search's ``index``-th probe (``probe-03-12.5rps``)."""
    return root / f"probe-{index:02d}-{rate:.4g}rps"


def latency(lat: Latencies) -> ProbeLatency:
    """The percentiles a capacity report shows of a probe's summary."""
    return ProbeLatency(lat.ttft.p50, lat.ttft.p99, lat.tpot.p50, lat.tpot.p99)


@dataclass(frozen=True)
class ProbeShape:
    """How long a probe runs and on which traffic."""

    samples: int = 200
    """Requests the measurement window should hold: the run lasts the scenario's warm-up
    and cool-down plus ``samples / rate``, and at least the scenario's duration (so that
    an overloaded cluster's queues have time to build), unless ``base.duration_s`` fixes
    it."""
    max_duration_s: float = 120.0
    """The longest a probe may last (low rates reach it before ``samples``)."""


class Probes:
    """The stress options of each probe: ``base`` at the rate, its own seed (the base seed
    plus the probe's index, so that a probe repeated at a rate adds other requests), and a
    duration that gives the window about ``shape.samples`` requests."""

    def __init__(self, base: StressOptions, shape: ProbeShape) -> None:
        plan = plan_run(base)
        self.base, self.shape = base, shape
        self.seed = plan.seed
        self.margin_s = plan.load.warmup_s + plan.load.cooldown_s
        self.least_s = plan.load.duration_s
        self.count = 0

    def next(self, rate: float, out_dir: Path | None = None) -> StressOptions:
        self.count += 1
        duration = self.base.duration_s
        if duration is None:
            want = self.margin_s + self.shape.samples / rate
            duration = min(self.shape.max_duration_s, max(want, self.least_s))
        seed = self.seed + self.count - 1
        return replace(
            self.base, rate=rate, duration_s=duration, seed=seed, out_dir=out_dir, strict=False
        )


class LiveProbe:
    """A stress run at the rate (:class:`Probes`); the run directories go under ``root``."""

    def __init__(
        self, probes: Probes, slo: Slo, root: Path, say: Callable[[str], None] = log.info
    ) -> None:
        self.probes, self.slo, self.root, self.say = probes, slo, root, say

    def __call__(self, rate: float) -> ProbeResult:
        out = probe_dir(self.root, self.probes.count + 1, rate)
        opts = self.probes.next(rate, out)
        t0 = time.monotonic()
        result = run_stress(opts, say=self.say)
        wall = time.monotonic() - t0
        got = attainment(read_records(result.records_path), result.plan.measured(), self.slo)
        gen = result.summary.generator
        behind: tuple[str, ...] = ()
        if gen.degraded:
            behind = tuple(gen.reasons) or ("the generator fell behind",)
        lat = latency(result.summary.latency)
        return ProbeResult(
            rate, got.met, got.judged, behind, str(out), wall, "live", lat, got.blocks
        )


@dataclass(frozen=True)
class TwinCase:
    """What a twin probe simulates: the cluster's replicas and the balancer's model."""

    replicas: Sequence[TwinReplica]
    routing: Callable[[RunPlan], RoutingModel]
    """The routing model for a plan (a fresh one per run: a model keeps state)."""
    options: TwinOptions


class TwinProbe:
    """The plan of the probe at the rate (:class:`Probes`), simulated in virtual time."""

    def __init__(self, probes: Probes, slo: Slo, case: TwinCase) -> None:
        self.probes, self.slo, self.case = probes, slo, case

    def __call__(self, rate: float) -> ProbeResult:
        plan = plan_run(self.probes.next(rate))
        run = simulate(plan, self.case.replicas, self.case.routing(plan), self.case.options)
        w = run.window
        got = attainment(run.records, (w.start, w.end), self.slo)
        lat = latency(run.summary().latency)
        return ProbeResult(rate, got.met, got.judged, (), None, run.cpu_s, "twin", lat, got.blocks)
