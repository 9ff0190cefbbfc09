"""Cross-check: exact figures from records against lbtune's exporter read from Prometheus.

The exporter counts a request in ``lbtune_requests_total`` and observes its TTFT
and E2E when the request *ends*, so the records compared are those that ended in
the window (``increase(...[W])`` at the window's end covers the same span).

* Counts by outcome agree when ``|prometheus - records| <= tolerance`` with
  ``tolerance = 1 + 2 * rate * scrape_interval``: ``increase()`` sees only the
  scraped samples inside the window and extrapolates to its edges, which can be
  off by up to one scrape interval's worth of requests at each edge.
* A quantile agrees when ``|prometheus - exact| <= resolution``, the resolution
  being the width of the histogram bucket holding the exact value — or, when
  Prometheus' estimate lies in a *neighbouring* bucket, the wider of the two:
  ``histogram_quantile`` ranks on ``q * n`` where the exact percentile
  interpolates between the order statistics at ``(n - 1) * q``, so near a bucket
  edge the two legitimately fall on either side of it. An exact value beyond the
  largest finite bucket cannot be compared.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

from lbtune.loadgen.records import OUTCOMES, RequestRecord
from lbtune.metrics.quantiles import MIN_SAMPLES, percentile
from lbtune.metrics.summary import CountCheck, CrossCheck, PromClientSide, QuantileCheck, Window


def _bucket_index(finite: Sequence[float], value: float) -> int | None:
    i = bisect.bisect_left(finite, value)
    return i if i < len(finite) else None


def _width(finite: Sequence[float], i: int) -> float:
    return finite[i] - (finite[i - 1] if i > 0 else 0.0)


def bucket_width(bounds: Sequence[float], value: float) -> float | None:
    """Width of the bucket ``(lower, le]`` holding ``value``; ``None`` above the last bound."""
    finite = sorted(b for b in bounds if b != float("inf"))
    i = _bucket_index(finite, value)
    return None if i is None else _width(finite, i)


def resolution(bounds: Sequence[float], exact: float, estimate: float) -> float | None:
    """Width of the exact value's bucket, or of the estimate's if it is the wider neighbour."""
    finite = sorted(b for b in bounds if b != float("inf"))
    i = _bucket_index(finite, exact)
    j = _bucket_index(finite, estimate)
    if i is None:
        return None
    width = _width(finite, i)
    if j is not None and abs(i - j) == 1:
        width = max(width, _width(finite, j))
    return width


MIN_WINDOW_SCRAPES = 10
"""Quantiles are compared only over windows of at least this many scrape intervals."""
MIN_CROSSCHECK_SAMPLES = 50
"""...and with at least this many samples (a P50 of 20 requests moves by whole buckets)."""


def cross_check(
    records: Sequence[RequestRecord],
    window: Window,
    prom: PromClientSide,
    *,
    scrape_interval_s: float = 1.0,
) -> CrossCheck:
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
            _quantile("ttft_p50", ttfts, 50.0, prom.ttft_p50, prom.ttft_buckets),
            _quantile("ttft_p99", ttfts, 99.0, prom.ttft_p99, prom.ttft_buckets),
            _quantile("e2e_p50", e2es, 50.0, prom.e2e_p50, prom.e2e_buckets),
            _quantile("e2e_p99", e2es, 99.0, prom.e2e_p99, prom.e2e_buckets),
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
    for q in quantiles:
        if q.agree is False:
            notes.append(f"{q.name}: {q.detail}")
    return CrossCheck(
        counts=tuple(counts), quantiles=tuple(quantiles), agree=agree, notes=tuple(notes)
    )


def _quantile(
    name: str, values: Sequence[float], q: float, estimate: float | None, bounds: Sequence[float]
) -> QuantileCheck:
    key = "p50" if q == 50.0 else "p99"
    if len(values) < max(MIN_SAMPLES[key], MIN_CROSSCHECK_SAMPLES):
        return QuantileCheck(
            name, None, estimate, None, None, f"too few samples ({len(values)}) to compare"
        )
    exact = percentile(values, q)
    if estimate is None:
        return QuantileCheck(name, exact, None, None, None, "no histogram in Prometheus")
    res = resolution(bounds, exact, estimate)
    if res is None:
        return QuantileCheck(
            name, exact, estimate, None, None, "beyond the largest finite histogram bucket"
        )
    agree = abs(estimate - exact) <= res + 1e-12
    detail = (
        f"exact {exact * 1000:.1f} ms, Prometheus {estimate * 1000:.1f} ms, "
        f"resolution {res * 1000:.1f} ms"
    )
    return QuantileCheck(name, exact, estimate, res, agree, detail)
