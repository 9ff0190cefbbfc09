"""A capacity search's report as data: the frame ``capacity.json`` holds and
:mod:`lbtune.capacity.report` (text, JSON) and :mod:`lbtune.capacity.plot` (``capacity.png``)
render.

Attainment vs the level (each probe with its Wilson interval), the fitted monotone curve
at each probed level, and the capacity with its CI; the twin's search beside the live one
when the twin placed the bracket, and how far apart their capacities were; each probe's
figures per replica, and which probe's the text report shows (:func:`replica_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.capacity.fit import wilson
from lbtune.capacity.replicas import ReplicaFigures
from lbtune.capacity.search import ProbeLatency, SearchResult, Unit
from lbtune.records.slo import Slo

__all__ = [
    "CapacityReport",
    "ProbeRow",
    "SearchFrame",
    "frame",
    "replica_probe",
    "twin_error",
]


@dataclass(frozen=True)
class ProbeRow:
    rate: float
    attainment: float | None
    ci: tuple[float, float]
    """Wilson interval of the attainment at the report's confidence."""
    met: int
    judged: int
    behind: tuple[str, ...]
    source: str
    run_dir: str | None
    wall_s: float
    latency: ProbeLatency | None = None
    """TTFT and TPOT percentiles of the probe's window."""
    blocks: tuple[tuple[int, int], ...] = ()
    """(met, judged) per time block of the window (the CI's resampling unit)."""
    replicas: tuple[ReplicaFigures, ...] = ()
    """Attainment and TTFT/TPOT per replica that served attributed requests in the
    window (:mod:`lbtune.capacity.replicas`); empty when none was attributed (and in a
    file written before the field)."""


@dataclass(frozen=True)
class SearchFrame:
    """One search (live or twin), as reported."""

    source: str
    kind: str
    capacity: float | None
    ci: tuple[float, float | None] | None
    converged: bool
    stopped: str | None
    cliff: tuple[float, float] | None
    """The rates between which attainment collapsed within one step."""
    curve: tuple[tuple[float, float], ...]
    probes: tuple[ProbeRow, ...]
    wall_s: float
    unit: Unit = "req/s"
    """What the levels (``rate``), the capacity and its CI are in: req/s, or closed-loop
    users (``--users``); a file written before the field is req/s."""
    spread: float | None = None
    """How much runs differ: the SD of a run's load as a share of the rate (the CI holds
    it; :func:`lbtune.capacity.fit.between_runs`); None when not bracketed or in a file
    written before the field."""
    spread_probes: int = 0
    """Probes near the capacity that measured :attr:`spread`."""


@dataclass(frozen=True)
class CapacityReport:
    scenario: str
    target: str
    slo: Slo
    attainment: float
    precision: float
    confidence: float
    live: SearchFrame | None
    twin: SearchFrame | None = None
    twin_error: float | None = None
    """``(twin - live) / live`` of the capacities, when both are bracketed."""


def frame(result: SearchResult, source: str, wall_s: float) -> SearchFrame:
    """The report's form of a search result."""
    est, conf = result.estimate, result.options.ci.confidence
    rows = tuple(
        ProbeRow(
            p.rate,
            p.point.attainment if p.judged else None,
            wilson(p.met, p.judged, conf),
            p.met,
            p.judged,
            p.behind,
            p.source,
            p.run_dir,
            round(p.wall_s, 3),
            p.latency,
            p.blocks,
            p.replicas,
        )
        for p in result.probes
    )
    cliff = None if est.cliff is None else (est.cliff.below.rate, est.cliff.above.rate)
    return SearchFrame(
        source,
        est.kind,
        est.capacity,
        est.ci,
        result.converged,
        result.stopped,
        cliff,
        est.curve,
        rows,
        round(wall_s, 3),
        result.options.unit,
        None if est.kind != "bracketed" else round(est.spread.sd, 4),
        est.spread.probes,
    )


def twin_error(live: SearchFrame | None, twin: SearchFrame | None) -> float | None:
    ok = live is not None and twin is not None and live.kind == twin.kind == "bracketed"
    if not ok or live is None or twin is None or not live.capacity or twin.capacity is None:
        return None
    return (twin.capacity - live.capacity) / live.capacity


def replica_probe(f: SearchFrame, target: float) -> tuple[ProbeRow, str] | None:
    """The probe whose figures per replica the report shows, and why it: the one nearest
    the capacity, where it matters which replica breaks the SLO first; without a capacity,
    the highest probe meeting ``target``, else the lowest (none met it: the nearest to
    meeting it). Only probes with attributed requests and a generator that kept up count
    (one that fell behind measured the generator); None when there is none."""
    rows = [p for p in f.probes if p.replicas and not p.behind]
    if not rows:
        return None
    if f.capacity is not None:
        cap = f.capacity
        return min(rows, key=lambda p: (abs(p.rate - cap), -p.judged)), "nearest the capacity"
    meeting = [p for p in rows if p.attainment is not None and p.attainment >= target]
    if meeting:
        return max(meeting, key=lambda p: (p.rate, p.judged)), "highest meeting the target"
    return min(rows, key=lambda p: (p.rate, -p.judged)), "none met the target: the lowest"
