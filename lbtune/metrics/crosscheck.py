"""Cross-check: the summary's figures against lbtune's exporter read from Prometheus.

The exporter counts a request in ``lbtune_requests_total`` and observes its TTFT
and E2E when the request *ends*, so ``increase(...[W])`` at the window's end covers
the requests that ended in the window.

* Counts by outcome (requests that ended in the window) agree when
  ``|prometheus - records| <= tolerance`` with
  ``tolerance = 1 + 2 * rate * scrape_interval``: ``increase()`` sees only the
  scraped samples inside the window and extrapolates to its edges, which can be
  off by up to one scrape interval's worth of requests at each edge.
* A quantile compares the summary's **own** figure (``latency.ttft.p99``: the same
  number as the latency table and the SLO check, over the requests sent in the
  window) with ``histogram_quantile``. Prometheus only knows which bucket a sample
  fell in, and it ranks on ``q * n`` where the exact percentile interpolates between
  the order statistics at ``(n - 1) * q``, so its estimate can legitimately lie
  anywhere in the bucket holding the exact value or in either neighbour. The
  tolerance is that band, ``[low, high]``: from the lower edge of the bucket below
  the exact value's to the upper edge of the bucket above it, widened to the same
  band around the percentile of the requests that *ended* in the window (the ones
  Prometheus counted). An exact value beyond the largest finite bucket cannot be
  compared. Every disagreement names the figure, both values and the band.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

from lbtune.loadgen.records import OUTCOMES, RequestRecord
from lbtune.metrics.quantiles import MIN_SAMPLES, percentile
from lbtune.metrics.summary import (
    CountCheck,
    CrossCheck,
    Latencies,
    LatencyStats,
    PromClientSide,
    QuantileCheck,
    Window,
)


def _finite(bounds: Sequence[float]) -> list[float]:
    return sorted(b for b in bounds if b != float("inf"))


def _bucket_index(finite: Sequence[float], value: float) -> int | None:
    i = bisect.bisect_left(finite, value)
    return i if i < len(finite) else None


def _lower(finite: Sequence[float], i: int) -> float:
    return finite[i - 1] if i > 0 else 0.0


def bucket_width(bounds: Sequence[float], value: float) -> float | None:
    """Width of the bucket ``(lower, le]`` holding ``value``; ``None`` above the last bound."""
    finite = _finite(bounds)
    i = _bucket_index(finite, value)
    return None if i is None else finite[i] - _lower(finite, i)


def band(bounds: Sequence[float], value: float) -> tuple[float, float] | None:
    """``[low, high]``: the bucket holding ``value`` and its two neighbours (finite ones).

    ``None`` when ``value`` lies above the largest finite bound. Above the last finite
    bucket ``histogram_quantile`` answers that bucket's upper bound, so ``high`` never
    exceeds it.
    """
    finite = _finite(bounds)
    i = _bucket_index(finite, value)
    if i is None:
        return None
    return _lower(finite, max(i - 1, 0)), finite[min(i + 1, len(finite) - 1)]


MIN_WINDOW_SCRAPES = 10
"""Quantiles are compared only over windows of at least this many scrape intervals."""
MIN_CROSSCHECK_SAMPLES = 50
"""...and with at least this many samples (a P50 of 20 requests moves by whole buckets)."""


def cross_check(
    records: Sequence[RequestRecord],
    window: Window,
    prom: PromClientSide,
    *,
    latency: Latencies,
    scrape_interval_s: float = 1.0,
) -> CrossCheck:
    """Counts and P50/P99 of ``latency`` (the summary's figures) against Prometheus."""
    ended = [r for r in records if window.contains(r.ended_at)]
    notes: list[str] = []
    counts: list[CountCheck] = []
    by_outcome: Counter[str] = Counter({o: 0 for o in OUTCOMES})
    by_outcome.update(r.outcome for r in ended)
    dur = window.duration or 1.0
    if prom.requests_by_outcome:
        for outcome in sorted(set(by_outcome) | set(prom.requests_by_outcome)):
            client = by_outcome[outcome]
            got = prom.requests_by_outcome.get(outcome, 0.0)
            tol = 1.0 + 2.0 * (client / dur) * scrape_interval_s
            counts.append(CountCheck(outcome, client, got, tol, abs(got - client) <= tol))
    else:
        notes.append("no lbtune_requests_total series in Prometheus: counts not compared")

    ok = [r for r in ended if r.outcome == "ok"]
    ttfts = [t for r in ok if (t := r.ttft) is not None]
    e2es = [r.e2e for r in ok]
    if dur < MIN_WINDOW_SCRAPES * scrape_interval_s:
        # Prometheus sees the window through scrapes: with only a few of them, which
        # requests fall inside differs from the records' exact set, so a histogram
        # quantile says nothing about measurement accuracy.
        notes.append(
            f"window of {dur:.0f} s is under {MIN_WINDOW_SCRAPES} scrape intervals: "
            "latency quantiles not compared"
        )
        quantiles: list[QuantileCheck] = []
    else:
        quantiles = [
            _quantile("ttft_p50", latency.ttft, ttfts, prom.ttft_p50, prom.ttft_buckets),
            _quantile("ttft_p99", latency.ttft, ttfts, prom.ttft_p99, prom.ttft_buckets),
            _quantile("e2e_p50", latency.e2e, e2es, prom.e2e_p50, prom.e2e_buckets),
            _quantile("e2e_p99", latency.e2e, e2es, prom.e2e_p99, prom.e2e_buckets),
        ]
    verdicts = [c.agree for c in counts] + [q.agree for q in quantiles]
    decided = [v for v in verdicts if v is not None]
    agree = None if not decided else all(decided)
    for c in counts:
        if c.agree is False:
            notes.append(
                f"requests {c.outcome}: records {c.client}, Prometheus {c.prometheus:.0f} "
                f"(tolerance ±{c.tolerance:.1f})"
            )
    notes.extend(f"{q.name}: {q.detail}" for q in quantiles if q.agree is False)
    return CrossCheck(
        counts=tuple(counts), quantiles=tuple(quantiles), agree=agree, notes=tuple(notes)
    )


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def _quantile(
    name: str,
    stats: LatencyStats,
    ended: Sequence[float],
    estimate: float | None,
    bounds: Sequence[float],
) -> QuantileCheck:
    key = name.rsplit("_", 1)[1]
    exact: float | None = getattr(stats, key)
    if exact is None or stats.count < max(MIN_SAMPLES[key], MIN_CROSSCHECK_SAMPLES):
        return QuantileCheck(
            name, None, estimate, None, None, f"too few samples ({stats.count}) to compare"
        )
    if estimate is None:
        return QuantileCheck(name, exact, None, None, None, "no histogram in Prometheus")
    around = band(bounds, exact)
    width = bucket_width(bounds, exact)
    if around is None or width is None:
        return QuantileCheck(
            name, exact, estimate, None, None, "beyond the largest finite histogram bucket"
        )
    low, high = around
    if ended:
        seen = band(bounds, percentile(ended, 50.0 if key == "p50" else 99.0))
        if seen is not None:
            low, high = min(low, seen[0]), max(high, seen[1])
    agree = low - 1e-12 <= estimate <= high + 1e-12
    detail = (
        f"records {_ms(exact)}, Prometheus {_ms(estimate)}, tolerance {_ms(low)} to "
        f"{_ms(high)} (histogram buckets around the exact value; its bucket is "
        f"{_ms(width)} wide)"
    )
    return QuantileCheck(name, exact, estimate, width, agree, detail, low, high)
