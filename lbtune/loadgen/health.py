"""Generator self-health: could the load generator have distorted the figures?

Response bytes are time-stamped by the kernel (:mod:`lbtune.loadgen.client`), so
event-loop lag no longer enters TTFT, ITL or E2E by itself. What lag can still
distort, and what is judged here, per generator process:

* **open-loop lateness** — ``sent_at - scheduled_at``: a late send shifts the
  arrival process (the latency itself is measured from ``sent_at``);
* **starved closed-loop users** — a user whose next request went out later than
  the end of its previous one: ``idle = sent_at(next) - ended_at(prev)``. The
  idle share of the users' time, ``Σ idle / Σ (idle + e2e)``, is how much lower
  the offered concurrency was than asked;
* **the TTFT timing-error bound** — a request's TTFT ``m`` is measured from right
  before its write; the write's duration and the first-token stamp's uncertainty (0
  when the kernel stamped it and no later byte shared its read, else the interval
  since the last stamped read) add up to its bound ``b`` (the record's
  ``first_token_bound_s``): its true TTFT lies in ``[m - b, m]``. A record from a
  ``loop``-timed client (TLS, kernel stamps off) has no such interval: the loop lag's
  P99 stands in for it, an estimate, not a bound. Each percentile lies in
  ``[P(m - b), P(m)]``; the bound printed for a figure is the larger of
  ``P(m) - P(m - b)`` (how much the figure could be overstated) and ``P(b)`` (so that
  the same percentile of the per-request errors is inside it too; ``P(b)`` is read a
  sampling margin higher, :func:`covering`, so it holds beyond this sample). Where the kernel
  left a first token unstamped, the record says ``timing="loop"`` and the worker's
  ``loop_stamped_share`` counts it;
* the open-loop in-flight cap (sends held back).

``degraded`` when open-loop lateness P99 > :data:`LATENESS_P99_LIMIT_S`, the
closed-loop idle share > :data:`IDLE_SHARE_LIMIT`, the TTFT P50 or P99 bound >
:data:`BOUND_SHARE_LIMIT` of that figure (and > :data:`BOUND_FLOOR_S`), or the
in-flight cap was hit. Event-loop lag (a greenlet sleeping 10 ms measures its
overshoot) and CPU % are still sampled and reported, but do not decide: they
matter only through the effects above. Everything here is pure; the sampler that feeds it
in a running generator is :class:`lbtune.loadgen.monitor.HealthMonitor`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BeforeValidator, TypeAdapter, computed_field

from lbtune.records import quantiles
from lbtune.records.jsonform import key_order

__all__ = [
    "BOUND_FLOOR_S",
    "BOUND_SHARE_LIMIT",
    "COVER_Z",
    "GENERATOR_HEALTH",
    "IDLE_SHARE_LIMIT",
    "LATENESS_P99_LIMIT_S",
    "WORKER_HEALTH",
    "GeneratorHealth",
    "HealthSample",
    "TimingBound",
    "WorkerHealth",
    "assess",
    "covering",
    "health_json",
    "load_reasons",
    "percentile",
    "timing_bound",
]

LATENESS_P99_LIMIT_S = 0.025
"""Open loop: sends later than this (P99) shift the arrival process visibly (25 ms is
a few per cent of the gap between sends at the tens of requests/s one LLM replica
takes; a scheduler tick on a busy 2-core machine stays well below it)."""
IDLE_SHARE_LIMIT = 0.05
"""Closed loop: users idle more than 5 % of their time offered 5 % less concurrency."""
BOUND_SHARE_LIMIT = 0.05
"""A TTFT figure that the generator's timing could overstate by more than 5 % (verdicts
that matter move figures by ten per cent and more; their CIs are wider than this)."""
BOUND_FLOOR_S = 0.005
"""...and by more than 5 ms (the accuracy the generator is built to: TTFT error P99
<= 5 ms at 256 streams, ``benchmarks/ttft_accuracy.py``)."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """:func:`lbtune.records.quantiles.percentile` (the one estimator); ``None`` when empty."""
    if not values:
        return None
    return quantiles.percentile(values, q)


@dataclass(frozen=True, slots=True)
class TimingBound:
    """A TTFT figure and how much the generator's time stamps could overstate it."""

    ttft_p50_s: float | None
    ttft_p99_s: float | None
    bound_p50_s: float | None
    """``max(P50(m) - P50(m - b), P50(b))``: the true P50 lies in [P50 - bound, P50], and
    the P50 of the per-request errors is at most this."""
    bound_p99_s: float | None
    inexact_share: float
    """Share of first tokens read late: their stamp is not exact (its own part of the
    bound > 0; the write's duration is in every bound and does not count)."""


COVER_Z = 1.645
"""One-sided 95 %: how many standard errors :func:`covering` adds."""


def covering(q: float, n: int) -> float:
    """The percentile of ``n`` per-request bounds that covers the ``q``-th percentile of
    the errors beyond this sample: ``q`` raised by :data:`COVER_Z` binomial standard errors
    of the share below it (capped at 100).

    ``P_q(b)`` bounds the ``q``-th percentile of *these* requests' errors exactly, but with
    the inexact share near ``1 - q`` it is a coin toss: a run at 512 streams with 0.9 %
    inexact first tokens printed a 0.4 ms bound while the P99 error of its last 4 s (1 %
    of them inexact) was 10 ms. The raised percentile holds for a window of the run, or
    the same process run again, at the cost of a wider bound where the share is that close.
    """
    p = q / 100.0
    return min(100.0, q + 100.0 * COVER_Z * math.sqrt(p * (1.0 - p) / max(1, n)))


def timing_bound(
    ttfts: Sequence[float], bounds: Sequence[float], read_bounds: Sequence[float] | None = None
) -> TimingBound:
    """The bound of TTFT P50/P99 from per-request measured TTFTs and their bounds;
    ``read_bounds``: each bound's first-token-stamp part (the bound less the write's
    duration; default: the whole bound)."""
    if not ttfts:
        return TimingBound(None, None, None, None, 0.0)
    low = [m - b for m, b in zip(ttfts, bounds, strict=True)]
    p50, p99 = quantiles.percentile(ttfts, 50), quantiles.percentile(ttfts, 99)
    pb = quantiles.percentile
    n = len(bounds)
    return TimingBound(
        ttft_p50_s=p50,
        ttft_p99_s=p99,
        bound_p50_s=max(0.0, p50 - pb(low, 50), pb(bounds, covering(50, n))),
        bound_p99_s=max(0.0, p99 - pb(low, 99), pb(bounds, covering(99, n))),
        inexact_share=sum(1 for b in (bounds if read_bounds is None else read_bounds) if b > 0)
        / len(bounds),
    )


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One second of one generator process."""

    t: float
    worker: str
    cpu_percent: float
    loop_lag_p99_s: float
    loop_lag_max_s: float
    lateness_p99_s: float | None
    in_flight: int
    sent: int
    completed: int
    in_flight_cap_hits: int


def assess(
    lateness: Sequence[float],
    bound: TimingBound | None = None,
    idle_share: float | None = None,
) -> tuple[bool, list[str]]:
    """(degraded, reasons) by the rules of this module's docstring."""
    reasons = load_reasons(percentile(lateness, 99), idle_share)
    if bound is not None:
        for name, fig, b in (
            ("P50", bound.ttft_p50_s, bound.bound_p50_s),
            ("P99", bound.ttft_p99_s, bound.bound_p99_s),
        ):
            if fig is None or b is None:
                continue
            limit = max(BOUND_FLOOR_S, BOUND_SHARE_LIMIT * fig)
            if b > limit:
                reasons.append(
                    f"TTFT {name} {fig * 1e3:.1f} ms may be overstated by up to"
                    f" {b * 1e3:.1f} ms > {limit * 1e3:.1f} ms"
                    f" ({BOUND_SHARE_LIMIT:.0%}, at least {BOUND_FLOOR_S * 1e3:g} ms)"
                )
    return bool(reasons), reasons


def load_reasons(
    lateness_p99_s: float | None, idle_share: float | None, cap_hits: int = 0
) -> list[str]:
    """The reasons the load itself was not what was asked (late sends, starved users,
    the in-flight cap), as against the TTFT timing bound: every figure depends on them."""
    reasons: list[str] = []
    if lateness_p99_s is not None and lateness_p99_s > LATENESS_P99_LIMIT_S:
        reasons.append(
            f"open-loop sends late: lateness P99 {lateness_p99_s * 1e3:.1f} ms"
            f" > {LATENESS_P99_LIMIT_S * 1e3:g} ms"
        )
    if idle_share is not None and idle_share > IDLE_SHARE_LIMIT:
        reasons.append(
            f"closed-loop users starved: idle {idle_share:.1%} of their time"
            f" > {IDLE_SHARE_LIMIT:.0%} (offered concurrency that much lower)"
        )
    if cap_hits:
        reasons.append(f"max in-flight cap hit {cap_hits} times (open-loop sends delayed)")
    return reasons


def _none_is_empty(value: object) -> object:
    """A worker's report with ``null`` reasons or samples reads as none."""
    return () if value is None else value


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """Summary of one generator process over the whole run.

    A worker sends it to the runner as its final report (:data:`WORKER_HEALTH`: every
    field, in field order); ``reasons`` and ``samples`` may be missing or ``null`` there.
    """

    worker: str
    pid: int
    lateness_p50_s: float | None
    lateness_p99_s: float | None
    lateness_max_s: float | None
    loop_lag_p50_s: float | None
    loop_lag_p99_s: float | None
    cpu_mean_percent: float | None
    cpu_p90_percent: float | None
    in_flight_cap_hits: int
    degraded: bool
    # JSON quirk kept from the hand-written form: a report without reasons or samples reads.
    reasons: Annotated[tuple[str, ...], BeforeValidator(_none_is_empty)] = ()
    samples: Annotated[tuple[HealthSample, ...], BeforeValidator(_none_is_empty)] = field(
        default_factory=tuple
    )
    timing: str = ""
    """``kernel``, ``loop`` or ``mixed``: where response stamps came from ("" = none)."""
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_bound_p50_s: float | None = None
    """How much TTFT P50 could be overstated by the generator's stamps."""
    ttft_bound_p99_s: float | None = None
    inexact_share: float = 0.0
    loop_stamped_share: float = 0.0
    """Share of first-token stamps that are the loop's time, not the kernel's (TLS, kernel
    stamps off, or a read the kernel left unstamped)."""
    idle_share: float | None = None
    """Closed loop: Σ idle / Σ (idle + e2e) over users' consecutive requests."""
    idle_max_s: float | None = None

    @property
    def load_reasons(self) -> tuple[str, ...]:
        """:attr:`reasons` less the TTFT timing bound's (:func:`load_reasons`)."""
        return tuple(load_reasons(self.lateness_p99_s, self.idle_share, self.in_flight_cap_hits))


WORKER_HEALTH: TypeAdapter[WorkerHealth] = TypeAdapter(WorkerHealth)
"""A worker's health to and from its report (``dump_python(mode="json")`` keeps NaN, as
the line's ``json.dumps`` and ``json.loads`` do)."""


def _worst(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return max(vs) if vs else None


@dataclass(frozen=True, slots=True)
class GeneratorHealth:
    """All generator processes of one run; degraded if any one was.

    Written to ``health.json`` (:func:`health_json`): the computed verdict, then the workers.
    """

    workers: tuple[WorkerHealth, ...]

    # JSON quirk kept from the hand-written form: the computed verdict (below), then the workers.
    _json = key_order(last=("workers",))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def degraded(self) -> bool:
        return any(w.degraded for w in self.workers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f"{w.worker}: {r}" for w in self.workers for r in w.reasons)

    @property
    def load_reasons(self) -> tuple[str, ...]:
        """:attr:`reasons` less the TTFT timing bound's: what makes every figure of the run
        untrusted, not only its TTFTs."""
        return tuple(f"{w.worker}: {r}" for w in self.workers for r in w.load_reasons)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def timing(self) -> str:
        kinds = {w.timing for w in self.workers if w.timing}
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ttft_bound_p50_s(self) -> float | None:
        return _worst([w.ttft_bound_p50_s for w in self.workers])

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ttft_bound_p99_s(self) -> float | None:
        return _worst([w.ttft_bound_p99_s for w in self.workers])

    @computed_field  # type: ignore[prop-decorator]
    @property
    def idle_share(self) -> float | None:
        return _worst([w.idle_share for w in self.workers])


GENERATOR_HEALTH: TypeAdapter[GeneratorHealth] = TypeAdapter(GeneratorHealth)


def health_json(health: GeneratorHealth) -> str:
    """``health.json``'s text (as ever without a final newline; NaN kept as ``NaN``)."""
    return json.dumps(GENERATOR_HEALTH.dump_python(health, mode="json"), indent=1)


def summarize(
    worker: str,
    lateness: Sequence[float],
    lag: Sequence[float],
    samples: Sequence[HealthSample],
    cap_hits: int,
    *,
    ttfts: Sequence[tuple[float, float | None]] = (),
    timings: Sequence[str] = (),
    idle: Sequence[tuple[float, float]] = (),
    read_bounds: Sequence[float | None] | None = None,
) -> WorkerHealth:
    """``ttfts``: (measured TTFT, bound or ``None`` = loop-timed client) of streamed ok
    requests, ``timings``: their records' timing, one each (or one kind for all);
    ``idle``: (idle before, e2e) of closed-loop users' consecutive requests;
    ``read_bounds``: each TTFT's bound less the write's duration (default: the bound)."""
    cpu = [s.cpu_percent for s in samples]
    lag_p99 = percentile(lag, 99)
    loop_b = lag_p99 or 0.0  # a loop-timed stamp may be late by the loop's lag
    reads = [b for _, b in ttfts] if read_bounds is None else read_bounds
    bound = timing_bound(
        [m for m, _ in ttfts],
        [loop_b if b is None else b for _, b in ttfts],
        [loop_b if b is None else b for b in reads],
    )
    idle_total = sum(i for i, _ in idle)
    idle_share = idle_total / (idle_total + sum(e for _, e in idle)) if idle else None
    degraded, reasons = assess(lateness, bound, idle_share)
    late = bound.inexact_share > 0.01 and "kernel" in timings
    if late and any(r.startswith("TTFT") for r in reasons):
        reasons.append(_busy_hint(bound.inexact_share, lag_p99))
    if cap_hits:
        reasons += load_reasons(None, None, cap_hits)
        degraded = True
    kinds = set(timings)
    return WorkerHealth(
        worker=worker,
        pid=os.getpid(),
        lateness_p50_s=percentile(lateness, 50),
        lateness_p99_s=percentile(lateness, 99),
        lateness_max_s=max(lateness) if lateness else None,
        loop_lag_p50_s=percentile(lag, 50),
        loop_lag_p99_s=lag_p99,
        cpu_mean_percent=sum(cpu) / len(cpu) if cpu else None,
        cpu_p90_percent=percentile(cpu[1:] if len(cpu) > 1 else cpu, 90),
        in_flight_cap_hits=cap_hits,
        degraded=degraded,
        reasons=tuple(reasons),
        samples=tuple(samples),
        timing=kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else ""),
        ttft_p50_s=bound.ttft_p50_s,
        ttft_p99_s=bound.ttft_p99_s,
        ttft_bound_p50_s=bound.bound_p50_s,
        ttft_bound_p99_s=bound.bound_p99_s,
        inexact_share=bound.inexact_share,
        loop_stamped_share=timings.count("loop") / len(timings) if timings else 0.0,
        idle_share=idle_share,
        idle_max_s=max(i for i, _ in idle) if idle else None,
    )


def _busy_hint(inexact_share: float, lag_p99: float | None) -> str:
    """Why first-token stamps went inexact, and what to do about it."""
    lag = "" if lag_p99 is None else f" (event-loop lag P99 {lag_p99 * 1e3:.0f} ms)"
    return (
        f"{inexact_share:.0%} of first tokens were read late{lag}, after later bytes had "
        "joined them: this process drives more streams than it reads on time; spread them "
        "over more processes (--workers) or cores, or run fewer streams"
    )
