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
   open there, below the lowest when it reaches under it);
3. **stops** when the capacity's CI (:func:`lbtune.capacity.fit.estimate`) is narrower
   than ``precision`` of the capacity and two probes near it or more measured how much
   runs differ (converged), or after ``max_probes`` probes, or when
   the generator fell behind (not converged; :attr:`SearchResult.stopped` says why).

A probe whose load generator fell behind (:attr:`ProbeResult.behind`) measured the
generator, not the cluster: it is redone (``redo_behind`` times); when it falls behind
again the search stops, since every higher rate would too, and the capacity is estimated
from the probes that were measured, the stop said plainly.

The search works on a **level** (a float, named ``rate`` in the records): an offered rate
in req/s, or a number of closed-loop users (:attr:`SearchOptions.unit`); the probe maps
it to a load. Users are counted, so a search over them probes **whole** levels only:
every level it picks is rounded (a bracket's low end down, its high end up; a step out of
the bracket to the next count at least), a bisection stops at adjacent counts, and the
capacity is the highest whole count the fitted curve meets the target at (the crossing
rounded down), its CI's ends rounded down alike. A CI of one user (two adjacent counts)
is as narrow as whole levels go: it is converged whatever ``precision`` asks. A level is
probed again only on purpose, as at any unit: to add requests at an end of a bracket
that is narrow enough, or to redo a probe whose generator fell behind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from lbtune.capacity.fit import CiOptions, Estimate, Point, estimate
from lbtune.capacity.replicas import ReplicaFigures

__all__ = [
    "SPREAD_PROBES",
    "Probe",
    "ProbeLatency",
    "ProbeResult",
    "Search",
    "SearchOptions",
    "SearchResult",
    "Steps",
    "Unit",
    "amount",
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
    """What one probe measured at one level (an offered rate, or users)."""

    rate: float
    """The level probed: req/s, or closed-loop users (:attr:`SearchOptions.unit`)."""
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
    replicas: tuple[ReplicaFigures, ...] = ()
    """Attainment and latency per replica that served attributed requests in the window
    (:mod:`lbtune.capacity.replicas`); empty when none was attributed."""

    @property
    def point(self) -> Point:
        return Point(self.rate, self.met, self.judged, self.blocks)


class Probe(Protocol):
    """Measures attainment at a level: an offered rate (req/s), or closed-loop users."""

    def __call__(self, rate: float) -> ProbeResult: ...


Unit = Literal["req/s", "users"]
"""What a search's level is: an open-loop offered rate, or a number of closed-loop users
(whole levels)."""


def amount(level: float, unit: Unit, spec: str = "g") -> str:
    """A level with its unit, as the search and the report print it (``1 user``,
    ``12.5 req/s``); ``spec`` formats the number."""
    if unit == "users":
        return f"{level:{spec}} user" if level == 1 else f"{level:{spec}} users"
    return f"{level:{spec}} req/s"


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs. ``start_rate``, ``bracket``, ``min_rate`` and ``max_rate`` are
    levels in ``unit`` (users when the search is over them: ``min_rate`` at least 1)."""

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
    unit: Unit = "req/s"

    def __post_init__(self) -> None:
        if not 0 < self.attainment < 1:
            raise ValueError(f"attainment must be in (0, 1), got {self.attainment}")
        if not self.precision > 0 or not self.growth > 1 or self.max_probes < 2:
            raise ValueError("precision > 0, growth > 1 and max_probes >= 2 are required")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError("0 < min_rate <= start_rate <= max_rate is required")
        if self.whole and not 1 <= self.min_rate <= math.floor(self.max_rate):
            raise ValueError(
                "a search over users needs 1 <= min_rate and a whole count up to max_rate"
            )

    @property
    def whole(self) -> bool:
        """Levels are whole numbers (users are counted)."""
        return self.unit == "users"


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
"""A search run step by step: it yields the next level to probe and is sent the result."""


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


SPREAD_PROBES = 2
"""Probes that must have measured the runs' spread (:attr:`Estimate.spread`) before a CI
counts as narrow."""


class Search:
    """One search's state; :meth:`steps` runs it, :meth:`result` reports it."""

    def __init__(self, opts: SearchOptions) -> None:
        self.opts = opts
        self.probes: list[ProbeResult] = []
        self.was_bracketed = False
        self.stopped: str | None = None

    def estimate(self) -> Estimate:
        points = [p.point for p in self.probes if not p.behind]
        est = estimate(points, self.opts.attainment, self.opts.ci)
        return _whole(est) if self.opts.whole else est

    def narrow(self, est: Estimate) -> bool:
        """The CI is as narrow as asked: within ``precision`` of the capacity, or, for
        whole levels, one level wide (two adjacent counts: no narrower one exists); and
        at least :data:`SPREAD_PROBES` probes near the capacity measured how much runs
        differ (a CI from one cannot know: a tuned config's single probe at 41.8 req/s
        attained 96 %, and other runs of it 77 % at 38.8)."""
        if est.spread.probes < SPREAD_PROBES:
            return False
        if est.width() <= self.opts.precision:
            return True
        return (
            self.opts.whole
            and est.ci is not None
            and est.ci[1] is not None
            and (est.ci[1] - est.ci[0] <= 1)
        )

    def result(self) -> SearchResult:
        est = self.estimate()
        converged = self.stopped is None and self.narrow(est)
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
            low = _level(lo, o, _down)
            yield from self.measure(low)
            if self.estimate().kind == "above":
                yield from self.measure(_level(max(hi, low + 1) if o.whole else hi, o, _up))
        else:
            yield from self.measure(_level(o.start_rate, o, _nearest))
        while True:
            est = self.estimate()
            if est.kind == "above":
                yield from self.walk(est, up=True)
            elif est.kind == "below":
                yield from self.walk(est, up=False)
            elif self.narrow(est):
                return
            else:
                self.was_bracketed = True
                self.budget(est)
                yield from self.measure(_next_rate(est, o))

    def walk(self, est: Estimate, *, up: bool) -> Steps:
        """One step out of an unbracketed state: double above the highest level, halve
        below the lowest (whole levels: to the next count at least)."""
        o = self.opts
        rates = [r for r, _ in est.curve]
        # Once bracketed, a probe pooled across the line moves it by a step, not a doubling.
        step = 1 + o.precision if self.was_bracketed else o.growth
        if up:
            top = max(rates)
            nxt = max(_up(top * step), top + 1) if o.whole else top * step
            if top >= o.max_rate:
                raise _Stop(
                    f"every probe up to {amount(o.max_rate, o.unit)} (the highest level "
                    "allowed) met the SLO: the capacity is at least that"
                )
        else:
            bottom = min(rates)
            nxt = min(_down(bottom / step), bottom - 1) if o.whole else bottom / step
            if bottom <= o.min_rate:
                att = est.curve[0][1]
                raise _Stop(
                    f"the SLO is not met even at {amount(bottom, o.unit)} (attainment "
                    f"{att:.1%} < {o.attainment:.1%}): no "
                    f"{'user count' if o.whole else 'rate'} this low serves it"
                )
        self.budget(est)
        yield from self.measure(_level(nxt, o, _nearest))

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
            at = amount(rate, self.opts.unit)
            raise _Stop(
                f"the load generator fell behind at {at} on {attempt + 1} "
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


_EPS = 1e-9
"""Slack for rounding a level computed in floating point (``10 * 1.1`` is 11, not 12)."""


def _down(x: float) -> float:
    return float(math.floor(x + _EPS))


def _up(x: float) -> float:
    return float(math.ceil(x - _EPS))


def _nearest(x: float) -> float:
    return float(math.floor(x + 0.5))


def _level(x: float, o: SearchOptions, rounding: Callable[[float], float]) -> float:
    """``x`` within ``[min_rate, max_rate]``; for whole levels, rounded by ``rounding``
    (within the whole counts of that range)."""
    x = min(max(x, o.min_rate), o.max_rate)
    if not o.whole:
        return x
    return min(max(rounding(x), _up(o.min_rate)), _down(o.max_rate))


def _whole(est: Estimate) -> Estimate:
    """The estimate in whole levels: the capacity is the highest whole level at which the
    fitted curve meets the target (the crossing rounded down), and a crossing in the CI
    ``[a, b]`` puts that level in ``[floor(a), floor(b)]``."""
    if est.kind != "bracketed" or est.capacity is None or est.ci is None:
        return est
    low, high = est.ci
    ci = (_down(low), None if high is None else _down(high))
    return replace(est, capacity=_down(est.capacity), ci=ci)


def _next_rate(est: Estimate, o: SearchOptions) -> float:
    """Bisect the bracket while it is wider than half the precision (the CI holds it) and,
    for whole levels, a count lies inside it; then, where replicates cross beyond the
    levels probed (above the top, or below the lowest: runs that differ at the lowest
    level can all miss), probe beyond them; then add requests at the bracket's end with
    fewer of them, where noise decides the crossing."""
    rates = [r for r, _ in est.curve]
    fitted = [f for _, f in est.curve]
    i = max(j for j, f in enumerate(fitted) if f >= o.attainment)
    lo, hi = rates[i], rates[i + 1]
    if hi / lo - 1 > o.precision / 2 and not (o.whole and hi - lo < 2):
        return _level((lo + hi) / 2, o, _nearest)
    if est.ci is not None and est.ci[1] is None:  # replicates cross above the top level
        top = rates[-1] * (1 + o.precision / 2)
        return _level(max(_up(top), rates[-1] + 1) if o.whole else top, o, _nearest)
    if est.ci is not None and est.ci[0] < rates[0]:  # ... or below the lowest one
        bottom = rates[0] * (1 - o.precision / 2)
        return _level(min(_down(bottom), rates[0] - 1) if o.whole else bottom, o, _nearest)
    return lo if est.judged[i] <= est.judged[i + 1] else hi
