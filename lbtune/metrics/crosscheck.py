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
  fell in, it ranks on ``q * n`` where the exact percentile interpolates between
  the order statistics at ``(n - 1) * q``, and the requests it counted differ from
  the records' by up to the count tolerance ``k`` above. So its estimate lies in a
  bucket that holds the exact value or a neighbour of it, or one that holds a
  request ranked within ``k`` of ``q * n`` among those that *ended* in the window.
  Where that rank runs past the largest (smallest) of them, the span reaches the
  largest (smallest) request observed by the window's end: ``increase()``
  extrapolates each bucket's counter on its own, and one that already held earlier
  requests comes out a fraction of a request ahead. The tolerance is the span of
  those buckets, ``[low, high]`` (above the largest finite bound
  ``histogram_quantile`` answers that bound). A P99 of a hundred requests thus
  reaches up to the bucket of the largest ones: Prometheus cannot tell it more
  finely. An exact value beyond the largest finite bucket cannot be compared.
  Every disagreement names the figure, both values and the tolerance.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence

from lbtune.metrics.summary import (
    CountCheck,
    CrossCheck,
    Latencies,
    PromClientSide,
    QuantileCheck,
    Window,
)
from lbtune.records.quantiles import MIN_SAMPLES, LatencyStats
from lbtune.records.requests import OUTCOMES, RequestRecord


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


def count_tolerance(n: int, window_s: float, scrape_interval_s: float) -> float:
    """How far Prometheus' count of ``n`` requests over the window may be off."""
    return 1.0 + 2.0 * (n / (window_s or 1.0)) * scrape_interval_s


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
            tol = count_tolerance(client, dur, scrape_interval_s)
            counts.append(CountCheck(outcome, client, got, tol, abs(got - client) <= tol))
    else:
        notes.append("no lbtune_requests_total series in Prometheus: counts not compared")

    ok = [r for r in ended if r.outcome == "ok"]
    ttfts = [t for r in ok if (t := r.ttft) is not None]
    e2es = [r.e2e for r in ok]
    k = count_tolerance(len(ok), dur, scrape_interval_s)
    before = [r for r in records if r.outcome == "ok" and r.ended_at < window.start]
    ttfts_before = [t for r in before if (t := r.ttft) is not None]
    e2es_before = [r.e2e for r in before]
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
            _quantile(
                "ttft_p50", latency.ttft, ttfts, ttfts_before, prom.ttft_p50, prom.ttft_buckets, k
            ),
            _quantile(
                "ttft_p99", latency.ttft, ttfts, ttfts_before, prom.ttft_p99, prom.ttft_buckets, k
            ),
            _quantile("e2e_p50", latency.e2e, e2es, e2es_before, prom.e2e_p50, prom.e2e_buckets, k),
            _quantile("e2e_p99", latency.e2e, e2es, e2es_before, prom.e2e_p99, prom.e2e_buckets, k),
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


def _rank_span(
    bounds: Sequence[float],
    ended: Sequence[float],
    earlier: Sequence[float],
    q: float,
    k: float,
) -> tuple[float, float] | None:
    """Buckets of the requests ranked within ``k`` of ``histogram_quantile``'s rank.

    Where the rank ± ``k`` runs past the end of ``ended`` (a tail thinner than the count
    tolerance), the span reaches the extreme of ``ended`` and ``earlier`` together: the
    requests observed before the window sit in the counters' first values, which
    ``increase()`` extrapolates bucket by bucket, so a bucket that held one of them can
    come out a fraction of a request ahead and catch the rank.
    """
    finite = _finite(bounds)
    if not ended or not finite:
        return None
    xs = sorted(ended)
    rank = q * len(xs)  # 1-based, as histogram_quantile ranks
    lo_v = xs[max(0, math.ceil(rank - k) - 1)]
    hi_v = xs[min(len(xs) - 1, max(0, math.ceil(rank + k) - 1))]
    if rank - k < 1:
        lo_v = min([xs[0], *earlier])
    if rank + k > len(xs):
        hi_v = max([xs[-1], *earlier])
    i_lo = _bucket_index(finite, lo_v)
    i_hi = _bucket_index(finite, hi_v)
    low = _lower(finite, len(finite) - 1 if i_lo is None else i_lo)
    high = finite[-1] if i_hi is None else finite[i_hi]
    return low, high


def _quantile(
    name: str,
    stats: LatencyStats,
    ended: Sequence[float],
    earlier: Sequence[float],
    estimate: float | None,
    bounds: Sequence[float],
    k: float,
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
    seen = _rank_span(bounds, ended, earlier, 0.5 if key == "p50" else 0.99, k)
    if seen is not None:
        low, high = min(low, seen[0]), max(high, seen[1])
    agree = low - 1e-12 <= estimate <= high + 1e-12
    detail = (
        f"records {_ms(exact)}, Prometheus {_ms(estimate)}, tolerance {_ms(low)} to "
        f"{_ms(high)} (the histogram buckets around the exact value, its own "
        f"{_ms(width)} wide, and of the requests ranked within {k:.0f} of Prometheus' rank)"
    )
    return QuantileCheck(name, exact, estimate, width, agree, detail, low, high)
