"""Two balancer configs' capacities, measured in turn, and their ratio with a CI; the gate.

``lbtune capacity --compare A.yaml B.yaml``: the two searches run interleaved, probe by
probe (A, B, A, B, ...; :func:`lbtune.capacity.search.interleave`), each probe applying
its config first, so that both see the same drift of the machine; with the twin, each
side's bracket is its own twin search's.

The ratio ``B / A`` gets the interval of every ratio of a capacity in B's CI to one in
A's, each CI drawn at ``sqrt(confidence)``: the two searches are independent, so both
hold their capacity with probability ``confidence`` and the ratio's interval holds the
true ratio at least that often (:func:`ratio`).

The gate (``--fail-on capacity=-5%``) fails when the whole interval of the ratio lies
below ``1 - 5 %``: a significant loss, beyond the limit (:func:`gate`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import TypeAdapter

from lbtune.capacity.fit import CiOptions, Point, estimate
from lbtune.capacity.frame import CapacityReport, SearchFrame, frame
from lbtune.capacity.report import describe_capacity, describe_slo
from lbtune.capacity.search import (
    Probe,
    ProbeResult,
    Search,
    SearchOptions,
    for_twin,
    interleave,
    search,
)
from lbtune.errors import ConfigError
from lbtune.records.slo import Slo

__all__ = [
    "Applied",
    "CompareReport",
    "Ratio",
    "Side",
    "SideReport",
    "compare_searches",
    "describe_compare",
    "dumps_compare",
    "gate",
    "load_report",
    "parse_gate",
    "points_of",
    "ratio",
]


@dataclass(frozen=True)
class Ratio:
    value: float | None
    """``b / a`` of the capacities; None unless both are bracketed."""
    ci: tuple[float, float | None] | None
    confidence: float


def points_of(f: SearchFrame) -> list[Point]:
    """The points a search's estimate was made of (its probes whose generator kept up)."""
    return [Point(p.rate, p.met, p.judged, p.blocks) for p in f.probes if not p.behind]


def ratio(a: SearchFrame, b: SearchFrame, target: float, ci: CiOptions) -> Ratio:
    """``B / A`` of two searches' capacities and its interval (see the module docstring)."""
    each = replace(ci, confidence=math.sqrt(ci.confidence))
    ea, eb = estimate(points_of(a), target, each), estimate(points_of(b), target, each)
    if ea.ci is None or eb.ci is None or ea.capacity is None or eb.capacity is None:
        return Ratio(None, None, ci.confidence)
    (a_lo, a_hi), (b_lo, b_hi) = ea.ci, eb.ci
    low = b_lo / a_hi if a_hi is not None else 0.0
    high = None if b_hi is None or a_lo <= 0 else b_hi / a_lo
    return Ratio(eb.capacity / ea.capacity, (low, high), ci.confidence)


_GATE = re.compile(r"^\s*capacity\s*=\s*([+-]?[0-9]*\.?[0-9]+)\s*%\s*$")


def parse_gate(text: str) -> float:
    """``capacity=-5%`` as -0.05 (the loss that fails the gate)."""
    m = _GATE.match(text)
    if m is None or float(m.group(1)) >= 0:
        raise ConfigError(
            f"--fail-on {text!r}: expected capacity=-N% (fail when the capacity fell by more "
            "than N %, significantly), e.g. --fail-on capacity=-5%"
        )
    return float(m.group(1)) / 100


def gate(r: Ratio, limit: float) -> str | None:
    """Why the gate fails (the whole CI of the ratio below ``1 + limit``), or None."""
    if r.ci is None or r.ci[1] is None or r.value is None:
        return None
    if r.ci[1] < 1 + limit:
        return (
            f"capacity fell to {r.value:.1%} of the reference ({r.confidence:.0%} CI "
            f"{r.ci[0]:.1%}–{r.ci[1]:.1%}), more than the {-limit:.0%} allowed (--fail-on)"
        )
    return None


@dataclass(frozen=True)
class Side:
    """One config of a comparison: its label, its live probe and its twin probe."""

    label: str
    live: Probe
    twin: Probe | None = None


def compare_searches(
    sides: Sequence[Side],
    opts: SearchOptions,
    twin_margin: float = 0.2,
    on_probe: Callable[[ProbeResult], None] | None = None,
) -> list[tuple[SearchFrame | None, SearchFrame]]:
    """Each side's twin search (when it has a twin), then the live searches interleaved;
    per side, its (twin, live) frames."""
    twins: list[SearchFrame | None] = []
    searches: list[tuple[Search, Probe]] = []
    for side in sides:
        sopts, tf = opts, None
        if side.twin is not None:
            t0 = time.monotonic()
            tres = search(side.twin, for_twin(opts), on_probe)
            tf = frame(tres, "twin", time.monotonic() - t0)
            cap = tres.estimate.capacity
            if cap is not None and tres.estimate.kind == "bracketed":
                sopts = replace(opts, bracket=(cap * (1 - twin_margin), cap * (1 + twin_margin)))
        twins.append(tf)
        searches.append((Search(sopts), side.live))
    t0 = time.monotonic()
    interleave(searches, on_probe)
    wall = time.monotonic() - t0  # both searches, in turn
    return [
        (tf, frame(s.result(), "live", wall)) for tf, (s, _) in zip(twins, searches, strict=True)
    ]


@dataclass(frozen=True)
class SideReport:
    label: str
    live: SearchFrame
    twin: SearchFrame | None = None
    twin_error: float | None = None


@dataclass(frozen=True)
class CompareReport:
    scenario: str
    target: str
    slo: Slo
    attainment: float
    precision: float
    confidence: float
    sides: tuple[SideReport, ...]
    ratio: Ratio
    """The last side's capacity over the first's."""
    failed: str | None = None
    """Why ``--fail-on`` failed, or None."""


def dumps_compare(report: CompareReport) -> str:
    return TypeAdapter(CompareReport).dump_json(report, indent=2).decode()


def load_report(path: Path) -> CapacityReport:
    """A ``capacity.json`` (or its directory) written by an earlier search."""
    p = path / "capacity.json" if path.is_dir() else path
    try:
        return TypeAdapter(CapacityReport).validate_json(p.read_bytes())
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"--baseline {path}: not a capacity report ({first})") from None


def describe_compare(report: CompareReport) -> list[str]:
    lines = [
        f"capacity at SLO, compared: {report.scenario} against {report.target}; "
        f"{describe_slo(report.slo, report.attainment)}"
    ]
    for side in report.sides:
        lines.append(f"{side.label}: {describe_capacity(side.live, report.confidence)}")
        if side.live.stopped:
            lines.append(f"{side.label}: search stopped: {side.live.stopped}")
        if side.twin_error is not None:
            lines.append(f"{side.label}: the twin's capacity was {side.twin_error:+.0%} off")
    r, a, b = report.ratio, report.sides[0].label, report.sides[-1].label
    if r.value is None or r.ci is None:
        lines.append(f"ratio {b}/{a}: not known (a capacity was not bracketed)")
    else:
        hi = "open" if r.ci[1] is None else f"{r.ci[1]:.3g}"
        lines.append(f"ratio {b}/{a}: {r.value:.3g} ({r.confidence:.0%} CI {r.ci[0]:.3g}–{hi})")
    if report.failed:
        lines.append(f"FAILED: {report.failed}")
    return lines


class Applied:
    """A probe that applies its side's config first (the balancer is shared by both)."""

    def __init__(self, apply: Callable[[], None], inner: Probe) -> None:
        self.apply, self.inner = apply, inner

    def __call__(self, rate: float) -> ProbeResult:
        self.apply()
        return self.inner(rate)
