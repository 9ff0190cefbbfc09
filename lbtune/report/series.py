"""Time series and distributions for the report's plots (pure data; the renderers only
draw it). Time series use ``t`` in seconds since the run start.

Time-series points (per-second latency percentiles) use the one percentile
(:func:`lbtune.records.quantiles.percentile`) *without* the sample-count rule of the
summary, so that a plot shows something at low rates; every point carries its sample
count ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lbtune.metrics.summary import RunSummary
from lbtune.records.quantiles import percentile
from lbtune.records.requests import RequestRecord
from lbtune.report.frame import ms, pct


@dataclass(frozen=True)
class TimePoint:
    t: float
    n: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None


@dataclass(frozen=True)
class RatePoint:
    t: float
    completed_per_s: float


@dataclass(frozen=True)
class HistBin:
    lo_ms: float
    hi_ms: float
    count: int


@dataclass(frozen=True)
class LoadPoint:
    label: str
    offered_load: float
    throughput_rps: float
    ttft_p99_ms: float | None
    meets_slo: bool | None


@dataclass(frozen=True)
class ReplicaPoint:
    replica: str
    share_pct: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    busy_pct: float | None


def throughput_over_time(
    records: Sequence[RequestRecord], run_start: float, bin_s: float = 1.0
) -> list[RatePoint]:
    """Successful requests completed per second, binned by end time (empty bins are 0)."""
    ends = [math.floor((r.ended_at - run_start) / bin_s) for r in records if r.outcome == "ok"]
    if not ends:
        return []
    counts: dict[int, int] = {}
    for b in ends:
        counts[b] = counts.get(b, 0) + 1
    return [RatePoint(b * bin_s, counts.get(b, 0) / bin_s) for b in range(min(ends), max(ends) + 1)]


def latency_over_time(
    records: Sequence[RequestRecord], run_start: float, bin_s: float = 1.0
) -> list[TimePoint]:
    """Per-bin P50/P99 of TTFT and E2E over successful requests, by send time."""
    bins: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.outcome == "ok":
            bins.setdefault(math.floor((r.sent_at - run_start) / bin_s), []).append(r)
    out = []
    for b in sorted(bins):
        group = bins[b]
        ttfts = [t for r in group if (t := r.ttft) is not None]
        e2es = [r.e2e for r in group]
        out.append(
            TimePoint(
                t=b * bin_s,
                n=len(group),
                ttft_p50_ms=_q_ms(ttfts, 50),
                ttft_p99_ms=_q_ms(ttfts, 99),
                e2e_p50_ms=_q_ms(e2es, 50),
                e2e_p99_ms=_q_ms(e2es, 99),
            )
        )
    return out


def _q_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return percentile(values, q) * 1000.0


def ttft_histogram(
    records: Sequence[RequestRecord], summary: RunSummary, bins: int = 40
) -> list[HistBin]:
    """TTFT distribution (ms) of successful requests sent in the window."""
    w = summary.window
    values = [
        t * 1000.0
        for r in records
        if r.outcome == "ok" and w.contains(r.sent_at) and (t := r.ttft) is not None
    ]
    if not values:
        return []
    counts, edges = np.histogram(np.asarray(values), bins=bins)
    return [
        HistBin(float(edges[i]), float(edges[i + 1]), int(counts[i])) for i in range(len(counts))
    ]


def throughput_vs_load(summary: RunSummary) -> list[LoadPoint]:
    """Completed throughput against offered load, per stage (or the window as one point)."""
    points = [
        LoadPoint(s.label, s.offered_load, s.throughput_rps, ms(s.ttft_p99), s.meets_slo)
        for s in summary.stages
        if s.offered_load is not None
    ]
    if points:
        return points
    t = summary.throughput
    if summary.outcomes.sent == 0:
        return []
    return [LoadPoint("window", t.sent_per_s, t.requests_per_s, ms(summary.latency.ttft.p99), None)]


def replica_load(summary: RunSummary) -> list[ReplicaPoint]:
    server = {r.replica: r for r in summary.server.replicas} if summary.server else {}
    out = []
    for r in summary.replicas:
        s = server.get(r.replica)
        busy = None if s is None else pct(s.busy_fraction)
        out.append(
            ReplicaPoint(
                r.replica,
                r.share * 100.0,
                ms(r.ttft_p50),
                ms(r.ttft_p99),
                ms(r.e2e_p50),
                ms(r.e2e_p99),
                busy,
            )
        )
    return out
