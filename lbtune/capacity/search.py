"""The capacity search: bracket, then narrow, until the CI is as narrow as asked (pure).

A :class:`Probe` measures attainment at one offered rate (a live stress run, a twin run,
or a test's hand-made curve). The search:

1. **brackets**: from the twin's bracket when given (its low end, then its high end),
   else from ``start_rate``; it doubles the rate (``growth``) while every probe meets the
   target and halves it while none does, within ``[min_rate, max_rate]``;
2. **narrows**: while the bracket (the highest rate meeting the target on the fitted
   curve and the next one probed) is wider than half the ``precision``, it probes its
   middle (bisection); once narrower, it probes again at whichever end of it has fewer
   requests, where noise decides the crossing (above the highest rate when the CI is
   open there);
3. **stops** when the capacity's CI (:func:`lbtune.capacity.fit.estimate`) is narrower
   than ``precision`` of the capacity (converged), or after ``max_probes`` probes, or when
   the generator fell behind (not converged; :attr:`SearchResult.stopped` says why).

A probe whose load generator fell behind (:attr:`ProbeResult.behind`) measured the
generator, not the cluster: it is redone (``redo_behind`` times); when it falls behind
again the search stops, since every higher rate would too, and the capacity is estimated
from the probes that were measured, the stop said plainly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from lbtune.capacity.fit import CiOptions, Estimate, Point, estimate

__all__ = [
    "Probe",
    "ProbeLatency",
    "ProbeResult",
    "Search",
    "SearchOptions",
    "SearchResult",
    "Steps",
    "for_twin",
    "interleave",
    "search",
]


@dataclass(frozen=True)
class ProbeLatency:
    """A probe's latency percentiles over its window (seconds; None: too few samples)."""

    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured at one offered rate."""

    rate: float
    met: int
    """Requests judged that met the SLO."""
    judged: int
    behind: tuple[str, ...] = ()
    """Why the load generator fell behind (empty: it kept up)."""
    run_dir: str | None = None
    wall_s: float = 0.0
    source: str = "live"
    """``live`` or ``twin``."""
    latency: ProbeLatency | None = None
    blocks: tuple[tuple[int, int], ...] = ()
    """(met, judged) per time block of the window (the block bootstrap's)."""

    @property
    def point(self) -> Point:
        return Point(self.rate, self.met, self.judged, self.blocks)


class Probe(Protocol):
    """Measures attainment at an offered rate (req/s)."""

    def __call__(self, rate: float) -> ProbeResult: ...


@dataclass(frozen=True)
class SearchOptions:
    attainment: float = 0.99
    """The share of requests that must meet the SLO."""
    precision: float = 0.1
    """Stop when the CI is narrower than this share of the capacity."""
    start_rate: float = 1.0
    bracket: tuple[float, float] | None = None
    """Rates expected to meet and to miss the target (the twin's), probed first."""
    min_rate: float = 0.05
    max_rate: float = 10_000.0
    max_probes: int = 12
    growth: float = 2.0
    redo_behind: int = 1
    ci: CiOptions = field(default_factory=CiOptions)

    def __post_init__(self) -> None:
        if not 0 < self.attainment < 1:
            raise ValueError(f"attainment must be in (0, 1), got {self.attainment}")
        if not self.precision > 0 or not self.growth > 1 or self.max_probes < 2:
            raise ValueError("precision > 0, growth > 1 and max_probes >= 2 are required")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError("0 < min_rate <= start_rate <= max_rate is required")


@dataclass(frozen=True)
class SearchResult:
    estimate: Estimate
    probes: tuple[ProbeResult, ...]
    """Every probe run, in order, those whose generator fell behind included."""
    converged: bool
    stopped: str | None
    """Why the search ended before its CI was narrow enough, in plain words."""
    options: SearchOptions

    @property
    def used(self) -> tuple[ProbeResult, ...]:
        """The probes the estimate is made of (the generator kept up)."""
        return tuple(p for p in self.probes if not p.behind)


class _Stop(Exception):
    pass


Steps = Generator[float, ProbeResult, None]
"""A search run step by step: it yields the next rate to probe and is sent the result."""


def search(
    probe: Probe, opts: SearchOptions, on_probe: Callable[[ProbeResult], None] | None = None
) -> SearchResult:
    """Search the capacity at ``opts.attainment`` with ``probe``; see the module docstring."""
    s = Search(opts)
    interleave([(s, probe)], on_probe)
    return s.result()


def interleave(
    searches: Sequence[tuple[Search, Probe]],
    on_probe: Callable[[ProbeResult], None] | None = None,
) -> None:
    """Run several searches probe by probe in turn (A, B, A, B, ...), each with its own
    probe, until each has stopped: two configs measured alternately see the same drift."""
    active = [(s.steps(), probe) for s, probe in searches]
    rates: list[float | None] = [next(gen, None) for gen, _ in active]
    while any(r is not None for r in rates):
        for i, (gen, probe) in enumerate(active):
            rate = rates[i]
            if rate is None:
                continue
            result = probe(rate)
            if on_probe is not None:
                on_probe(result)
            try:
                rates[i] = gen.send(result)
            except StopIteration:
                rates[i] = None


class Search:
    """One search's state; :meth:`steps` runs it, :meth:`result` reports it."""

    def __init__(self, opts: SearchOptions) -> None:
        self.opts = opts
        self.probes: list[ProbeResult] = []
        self.was_bracketed = False
        self.stopped: str | None = None

    def estimate(self) -> Estimate:
        points = [p.point for p in self.probes if not p.behind]
        return estimate(points, self.opts.attainment, self.opts.ci)

    def result(self) -> SearchResult:
        est = self.estimate()
        converged = self.stopped is None and est.width() <= self.opts.precision
        return SearchResult(est, tuple(self.probes), converged, self.stopped, self.opts)

    def steps(self) -> Steps:
        try:
            yield from self._run()
        except _Stop as stop:
            self.stopped = str(stop)

    def _run(self) -> Steps:
        o = self.opts
        if o.bracket is not None:
            lo, hi = sorted(o.bracket)
            yield from self.measure(_clamp(lo, o))
            if self.estimate().kind == "above":
                yield from self.measure(_clamp(hi, o))
        else:
            yield from self.measure(o.start_rate)
        while True:
            est = self.estimate()
            if est.kind == "above":
                yield from self.walk(est, up=True)
            elif est.kind == "below":
                yield from self.walk(est, up=False)
            elif est.width() <= o.precision:
                return
            else:
                self.was_bracketed = True
                self.budget(est)
                yield from self.measure(_next_rate(est, o))

    def walk(self, est: Estimate, *, up: bool) -> Steps:
        """One step out of an unbracketed state: double above the highest rate, halve
        below the lowest."""
        o = self.opts
        rates = [r for r, _ in est.curve]
        # Once bracketed, a probe pooled across the line moves it by a step, not a doubling.
        step = 1 + o.precision if self.was_bracketed else o.growth
        if up:
            nxt = max(rates) * step
            if max(rates) >= o.max_rate:
                raise _Stop(
                    f"every probe up to {o.max_rate:g} req/s (the highest rate allowed) met "
                    "the SLO: the capacity is at least that"
                )
        else:
            nxt = min(rates) / step
            if min(rates) <= o.min_rate:
                att = est.curve[0][1]
                raise _Stop(
                    f"the SLO is not met even at {min(rates):g} req/s (attainment "
                    f"{att:.1%} < {o.attainment:.1%}): no rate this low serves it"
                )
        self.budget(est)
        yield from self.measure(min(max(nxt, o.min_rate), o.max_rate))

    def budget(self, est: Estimate) -> None:
        if len(self.probes) >= self.opts.max_probes:
            width = "open" if math.isinf(est.width()) else f"{est.width():.0%} wide"
            raise _Stop(
                f"{len(self.probes)} probes run (--max-probes) and the CI is still {width}, "
                f"wider than the {self.opts.precision:.0%} asked"
            )

    def measure(self, rate: float) -> Steps:
        for attempt in range(self.opts.redo_behind + 1):
            result = yield rate
            self.probes.append(result)
            if not result.behind:
                return
            if attempt < self.opts.redo_behind and len(self.probes) < self.opts.max_probes:
                continue
            raise _Stop(
                f"the load generator fell behind at {rate:g} req/s on {attempt + 1} "
                f"tr{'y' if attempt == 0 else 'ies'} ({'; '.join(result.behind)}): the search "
                "stops there, and the capacity is estimated from the probes it measured "
                "(more generator processes: --workers)"
            )


TWIN_PROBES = 24
"""A twin search's probe budget: a twin probe costs seconds of CPU, not a minute of load,
so it is not held to the live search's ``max_probes``."""


def for_twin(opts: SearchOptions) -> SearchOptions:
    """The options of the twin search that places a live search's bracket."""
    return replace(opts, max_probes=max(opts.max_probes, TWIN_PROBES), bracket=None)


def _clamp(rate: float, o: SearchOptions) -> float:
    return min(max(rate, o.min_rate), o.max_rate)


def _next_rate(est: Estimate, o: SearchOptions) -> float:
    """Bisect the bracket while it is wider than half the precision (the CI holds it);
    then add requests at its end with fewer of them, where noise decides the crossing."""
    rates = [r for r, _ in est.curve]
    fitted = [f for _, f in est.curve]
    i = max(j for j, f in enumerate(fitted) if f >= o.attainment)
    lo, hi = rates[i], rates[i + 1]
    if hi / lo - 1 > o.precision / 2:
        return (lo + hi) / 2
    if est.ci is not None and est.ci[1] is None:  # replicates cross above the top rate
        return min(rates[-1] * (1 + o.precision / 2), o.max_rate)
    return lo if est.judged[i] <= est.judged[i + 1] else hi
