"""How many generator processes a run uses on this machine, when the user did not say.

One generator process reads its streams on one event loop. Up to about
:data:`STREAMS_PER_PROCESS` concurrent streams it keeps each first token's stamp within a
few milliseconds on a busy 2-core machine (``docs/loadgen.md``, TTFT accuracy: P99 error
≤ 5 ms at 256 streams, misses beyond it at 512). Beyond that, the run is spread over
Locust's distributed mode: a master and one worker per :data:`STREAMS_PER_PROCESS` streams,
as many as the cores lbtune may use. Where the machine has too few cores for that, the
run goes ahead on what there is and says so before it starts; its generator health says
afterwards whether the timing held (it never claims a bound it does not have).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from lbtune.process import affinity
from lbtune.scenario.runplan import RunPlan

__all__ = ["STREAMS_PER_PROCESS", "Spread", "peak_streams", "spread", "usable_cores"]

STREAMS_PER_PROCESS = 256
"""Concurrent streams one generator process reads on time (``docs/loadgen.md``)."""


@dataclass(frozen=True)
class Spread:
    """The generator processes of one run: ``workers`` local Locust workers under a master
    (0: one local process), and what to tell the user about the choice (or None)."""

    workers: int
    note: str | None = None


def usable_cores(cpus: Collection[int] | None = None) -> int:
    """The CPUs the generator may run on: ``cpus`` when it is pinned there (off a cluster's
    pinned servers: :attr:`lbtune.run.target.ResolvedTarget.generator_cpus`), else those
    this process may run on (its affinity, not the machine's count)."""
    return len(cpus) if cpus else len(affinity.usable())


def peak_streams(plan: RunPlan) -> int | None:
    """The most concurrent streams the plan asks for: its closed-loop users at their
    peak; None for an open loop (its concurrency is the server's to decide; the in-flight
    cap and the generator's health cover it)."""
    if plan.load.mode != "closed":
        return None
    levels: list[float] = [s.users for s in plan.stages() if s.users is not None]
    levels += [s.ramp_from for s in plan.stages() if s.ramp_from is not None and s.users]
    return max((math.ceil(u) for u in levels), default=None)


def spread(streams: int | None, cores: int) -> Spread:
    """The processes for ``streams`` concurrent streams on ``cores`` usable cores."""
    if streams is None or streams <= STREAMS_PER_PROCESS:
        return Spread(0)
    need = math.ceil(streams / STREAMS_PER_PROCESS)
    if cores >= need:
        return Spread(
            need,
            f"generator: {streams} streams over {need} processes (one reads about "
            f"{STREAMS_PER_PROCESS} on time; --workers 0 keeps one)",
        )
    if cores <= 1:
        return Spread(
            0,
            f"generator: {streams} streams on one process (the generator may use one core "
            f"here; one process reads about {STREAMS_PER_PROCESS} on time): the run's "
            "generator health will say whether its timing held",
        )
    return Spread(
        cores,
        f"generator: {streams} streams over {cores} processes, one per usable core "
        f"({need} would read them on time, about {STREAMS_PER_PROCESS} each): the run's "
        "generator health will say whether its timing held",
    )
