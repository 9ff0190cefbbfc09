"""The probes of a capacity search: a live stress run, or a twin run, at one level.

A level is an open-loop offered rate (req/s) or a number of closed-loop users, as the
search's unit says (:data:`~lbtune.capacity.search.Unit`); :func:`load_at` maps it to the
stress options (``rate`` or ``users``, the scenario's shape otherwise).

A live probe is an ordinary load test (:func:`lbtune.run.stress.run_stress`) at the level,
with its run directory and records; its attainment is computed from those records
(:mod:`lbtune.capacity.attainment`), as are its figures per replica
(:mod:`lbtune.capacity.replicas`), and the generator's health comes from its summary: a
probe whose generator fell behind says why
(:attr:`~lbtune.capacity.search.ProbeResult.behind`), and the search redoes it or stops.

A twin probe is the same plan simulated in virtual time (:func:`lbtune.twin.run.simulate`):
seconds of CPU instead of a minute of traffic, used to place the live search's bracket.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from lbtune.capacity.attainment import attainment
from lbtune.capacity.replicas import replica_figures
from lbtune.capacity.search import ProbeLatency, ProbeResult, Unit
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

__all__ = [
    "LiveProbe",
    "ProbeShape",
    "Probes",
    "TwinCase",
    "TwinProbe",
    "latency",
    "load_at",
    "probe_dir",
]

log = logging.getLogger(__name__)


def probe_dir(root: Path, index: int, level: float, unit: Unit = "req/s") -> Path:
    """The run directory of a search's ``index``-th probe (``probe-03-12.5rps``,
    ``probe-04-24users``)."""
    return root / f"probe-{index:02d}-{level:.4g}{'users' if unit == 'users' else 'rps'}"


def load_at(base: StressOptions, level: float, unit: Unit) -> StressOptions:
    """``base`` at a search's level: ``level`` closed-loop users (a whole count, at least
    1), or an open-loop offered rate of ``level`` req/s."""
    if unit == "users":
        users = math.floor(level + 0.5)
        if users < 1 or abs(users - level) > 1e-9:
            raise ValueError(f"closed-loop users are a whole count >= 1, got {level:g}")
        return replace(base, users=users, rate=None)
    return replace(base, rate=level, users=None)


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
    """The stress options of each probe: ``base`` at the level (:func:`load_at`), its own
    seed (the base seed plus the probe's index, so that a probe repeated at a level adds
    other requests), and a duration.

    Open loop, the duration gives the window about ``shape.samples`` requests; closed loop,
    how many requests the users send depends on the latencies they meet, so a probe lasts
    the scenario's duration (at most ``shape.max_duration_s``) unless ``base.duration_s``
    fixes it. Made, the options of a first probe are planned: a scenario that cannot run
    at the unit (a trace setting its own arrivals) is a one-line ConfigError here."""

    def __init__(self, base: StressOptions, shape: ProbeShape, unit: Unit = "req/s") -> None:
        plan = plan_run(load_at(base, 1.0, unit))
        self.base, self.shape, self.unit = base, shape, unit
        self.seed = plan.seed
        self.margin_s = plan.load.warmup_s + plan.load.cooldown_s
        self.least_s = plan.load.duration_s
        self.count = 0

    def next(self, level: float, out_dir: Path | None = None) -> StressOptions:
        self.count += 1
        duration = self.base.duration_s
        if duration is None and self.unit == "users":
            duration = min(self.shape.max_duration_s, self.least_s)
        elif duration is None:
            want = self.margin_s + self.shape.samples / level
            duration = min(self.shape.max_duration_s, max(want, self.least_s))
        seed = self.seed + self.count - 1
        at = load_at(self.base, level, self.unit)
        return replace(at, duration_s=duration, seed=seed, out_dir=out_dir, strict=False)


class LiveProbe:
    """A stress run at the level (:class:`Probes`); the run directories go under ``root``."""

    def __init__(
        self, probes: Probes, slo: Slo, root: Path, say: Callable[[str], None] = log.info
    ) -> None:
        self.probes, self.slo, self.root, self.say = probes, slo, root, say

    def __call__(self, rate: float) -> ProbeResult:
        out = probe_dir(self.root, self.probes.count + 1, rate, self.probes.unit)
        opts = self.probes.next(rate, out)
        t0 = time.monotonic()
        result = run_stress(opts, say=self.say)
        wall = time.monotonic() - t0
        records, window = read_records(result.records_path), result.plan.measured()
        got = attainment(records, window, self.slo)
        gen = result.summary.generator
        behind: tuple[str, ...] = ()
        if gen.degraded:
            behind = tuple(gen.reasons) or ("the generator fell behind",)
        lat = latency(result.summary.latency)
        per = replica_figures(records, window, self.slo)
        return ProbeResult(
            rate, got.met, got.judged, behind, str(out), wall, "live", lat, got.blocks, per
        )


@dataclass(frozen=True)
class TwinCase:
    """What a twin probe simulates: the cluster's replicas and the balancer's model."""

    replicas: Sequence[TwinReplica]
    routing: Callable[[RunPlan], RoutingModel]
    """The routing model for a plan (a fresh one per run: a model keeps state)."""
    options: TwinOptions


class TwinProbe:
    """The plan of the probe at the level (:class:`Probes`), simulated in virtual time."""

    def __init__(self, probes: Probes, slo: Slo, case: TwinCase) -> None:
        self.probes, self.slo, self.case = probes, slo, case

    def __call__(self, rate: float) -> ProbeResult:
        plan = plan_run(self.probes.next(rate))
        run = simulate(plan, self.case.replicas, self.case.routing(plan), self.case.options)
        window = (run.window.start, run.window.end)
        got = attainment(run.records, window, self.slo)
        lat = latency(run.summary().latency)
        per = replica_figures(run.records, window, self.slo)
        return ProbeResult(
            rate, got.met, got.judged, (), None, run.cpu_s, "twin", lat, got.blocks, per
        )
