"""A capacity search's report: the frame (pure data, ``capacity.json``) and its text.

Attainment vs offered rate (each probe with its Wilson interval), the fitted monotone
curve at each probed rate, and the capacity with its CI; the twin's search beside the
live one when the twin placed the bracket, and how far apart their capacities were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter

from lbtune.capacity.fit import wilson
from lbtune.capacity.search import ProbeLatency, SearchResult
from lbtune.records.slo import Slo

__all__ = ["CapacityReport", "ProbeRow", "SearchFrame", "describe", "dumps", "frame", "write"]


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


_ADAPTER = TypeAdapter(CapacityReport)


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
    )


def twin_error(live: SearchFrame | None, twin: SearchFrame | None) -> float | None:
    ok = live is not None and twin is not None and live.kind == twin.kind == "bracketed"
    if not ok or live is None or twin is None or not live.capacity or twin.capacity is None:
        return None
    return (twin.capacity - live.capacity) / live.capacity


def dumps(report: CapacityReport) -> str:
    return _ADAPTER.dump_json(report, indent=2).decode()


def write(report: CapacityReport, out_dir: Path) -> Path:
    """``capacity.json`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "capacity.json"
    path.write_text(dumps(report) + "\n")
    return path


def _ms(s: float | None) -> str:
    return "-" if s is None else (f"{s * 1000:.3g}ms" if s < 1 else f"{s:.3g}s")


def describe_slo(slo: Slo, share: float) -> str:
    bounds = [
        f"{name} ≤ {_ms(v)}"
        for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s), ("E2E", slo.e2e_s))
        if v is not None
    ]
    return f"{', '.join(bounds) or 'no latency bound'} for {share:.4g} of requests"


def describe_capacity(f: SearchFrame, confidence: float) -> str:
    """One line: the capacity and its CI, or what the search could say instead."""
    if f.kind == "below" or f.capacity is None:
        head = "capacity: none found (the SLO was not met at any rate probed)"
    elif f.kind == "above":
        head = f"capacity: at least {f.capacity:.4g} req/s (every rate probed met the SLO)"
    else:
        assert f.ci is not None
        hi = "open" if f.ci[1] is None else f"{f.ci[1]:.4g}"
        head = f"capacity: {f.capacity:.4g} req/s ({confidence:.0%} CI {f.ci[0]:.4g}–{hi})"
    state = "converged" if f.converged else "not converged"
    return f"{head}; {state}, {len(f.probes)} {f.source} probes in {f.wall_s:.0f} s"


def describe(report: CapacityReport) -> list[str]:
    """The report as text lines: the table, the capacity, the cliff, the twin, the stop."""
    lines = [
        f"capacity at SLO: {report.scenario} against {report.target}; "
        f"{describe_slo(report.slo, report.attainment)}"
    ]
    ci_head = f"{report.confidence:.0%} CI"
    for f in (report.twin, report.live):
        if f is None:
            continue
        fitted = dict(f.curve)
        lines.append(
            f"  {f.source:<5} {'rate/s':>8} {'attained':>9} {ci_head:>15} {'fitted':>8} "
            f"{'judged':>7} {'TTFT p50/p99':>15} {'TPOT p50/p99':>15}"
        )
        for p in sorted(f.probes, key=lambda p: p.rate):
            att = "-" if p.attainment is None else f"{p.attainment:.2%}"
            fit = "behind" if p.behind else f"{fitted.get(p.rate, float('nan')):.2%}"
            ci = f"{p.ci[0]:.1%}–{p.ci[1]:.1%}"
            lat = p.latency or ProbeLatency()
            ttft = f"{_ms(lat.ttft_p50)}/{_ms(lat.ttft_p99)}"
            tpot = f"{_ms(lat.tpot_p50)}/{_ms(lat.tpot_p99)}"
            lines.append(
                f"  {'':<5} {p.rate:>8.4g} {att:>9} {ci:>15} {fit:>8} {p.judged:>7} "
                f"{ttft:>15} {tpot:>15}"
            )
        lines.append(describe_capacity(f, report.confidence))
        if f.cliff is not None:
            lines.append(
                f"cliff: attainment collapsed between {f.cliff[0]:.4g} and {f.cliff[1]:.4g} "
                "req/s, within one step: no margin above the capacity"
            )
        if f.stopped:
            lines.append(f"{f.source} search stopped: {f.stopped}")
    if report.twin_error is not None:
        lines.append(f"twin: its capacity was {report.twin_error:+.0%} from the live one")
    return lines
