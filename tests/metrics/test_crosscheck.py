"""Cross-check of records against lbtune's exporter read back from Prometheus."""

from __future__ import annotations

import pytest

from lbtune.metrics.crosscheck import band, bucket_width, cross_check
from lbtune.metrics.stats import latencies, sent_in
from lbtune.metrics.summary import CrossCheck, PromClientSide, Window
from lbtune.records.requests import RequestRecord
from tests.metrics.records import rec

T0 = 3_000_000.0
BOUNDS = (0.025, 0.05, 0.1, 0.25, 0.5, float("inf"))


def test_bucket_width_and_resolution() -> None:
    assert bucket_width(BOUNDS, 0.01) == 0.025  # (0, 0.025]
    assert bucket_width(BOUNDS, 0.05) == pytest.approx(0.025)  # (0.025, 0.05]: le is inclusive
    assert bucket_width(BOUNDS, 0.07) == pytest.approx(0.05)
    assert bucket_width(BOUNDS, 0.7) is None  # beyond the largest finite bound
    # The value's bucket and both neighbours.
    assert band(BOUNDS, 0.06) == pytest.approx((0.025, 0.25))
    assert band(BOUNDS, 0.01) == pytest.approx((0.0, 0.05))  # first bucket: from 0
    assert band(BOUNDS, 0.3) == pytest.approx((0.1, 0.5))  # last finite: up to its bound
    assert band(BOUNDS, 0.7) is None


def _check(
    records: list[RequestRecord], window: Window, prom: PromClientSide, **kw: float
) -> CrossCheck:
    """As ``summarize`` calls it: with the summary's own latency figures."""
    lat = latencies(sent_in(records, window))
    return cross_check(records, window, prom, latency=lat, **kw)


def _records() -> list[RequestRecord]:
    # 100 ok requests ending in the window, TTFT 0.06 s, E2E 0.3 s, plus 3 timeouts.
    ok = [rec(i, sent=T0 + i * 0.1, ttft=0.06, e2e=0.3) for i in range(100)]
    bad = [rec(200 + i, sent=T0 + 1 + i, ttft=None, e2e=2.0, outcome="timeout") for i in range(3)]
    return ok + bad


def test_agreement_within_resolution_and_tolerance() -> None:
    prom = PromClientSide(
        requests_by_outcome={"ok": 101.2, "timeout": 3.0},
        ttft_p50=0.075,  # exact 0.06 in (0.05, 0.1]: |0.075 - 0.06| <= 0.05
        ttft_p99=0.0995,
        ttft_buckets=BOUNDS,
        e2e_p50=0.3,
        e2e_p99=0.35,
        e2e_buckets=BOUNDS,
    )
    cc = _check(_records(), Window(T0, T0 + 20), prom, scrape_interval_s=1.0)
    counts = {c.outcome: c for c in cc.counts}
    # 100 ok in 20 s = 5 req/s; tolerance = 1 + 2 * 5 * 1 = 11.
    assert counts["ok"].client == 100 and counts["ok"].tolerance == pytest.approx(11.0)
    assert counts["timeout"].client == 3 and counts["connect_error"].prometheus == 0.0
    assert all(c.agree for c in cc.counts)
    assert all(q.agree for q in cc.quantiles) and cc.agree is True and cc.notes == ()


def test_disagreement_is_flagged_with_the_figure_both_values_and_the_tolerance() -> None:
    prom = PromClientSide(
        requests_by_outcome={"ok": 60.0, "timeout": 3.0},
        ttft_p99=0.3,  # exact 0.06 in (0.05, 0.1]: band 0.025 to 0.25, 0.3 beyond it
        ttft_buckets=BOUNDS,
    )
    cc = _check(_records(), Window(T0, T0 + 20), prom, scrape_interval_s=1.0)
    assert cc.agree is False
    assert {c.outcome: c.agree for c in cc.counts}["ok"] is False
    assert "requests ok: records 100, Prometheus 60 (tolerance ±11.0)" in cc.notes
    q = {x.name: x for x in cc.quantiles}
    assert q["ttft_p99"].agree is False and q["ttft_p99"].resolution == pytest.approx(0.05)
    assert (q["ttft_p99"].low, q["ttft_p99"].high) == pytest.approx((0.025, 0.25))
    assert (
        "ttft_p99: records 60.0 ms, Prometheus 300.0 ms, tolerance 25.0 ms to 250.0 ms "
        "(the histogram buckets around the exact value, its own 50.0 ms wide, and of the "
        "requests ranked within 11 of Prometheus' rank)"
    ) in cc.notes
    assert q["e2e_p50"].agree is None and q["e2e_p50"].detail == "no histogram in Prometheus"


def test_quantile_band() -> None:
    def ttft_p50(estimate: float) -> bool | None:
        prom = PromClientSide(
            requests_by_outcome={"ok": 100.0}, ttft_p50=estimate, ttft_buckets=BOUNDS
        )
        q = {x.name: x for x in _check(_records(), Window(T0, T0 + 20), prom).quantiles}
        return q["ttft_p50"].agree

    # Exact 0.06 in (0.05, 0.1]: anything in (0.025, 0.05] .. (0.1, 0.25] agrees.
    assert ttft_p50(0.03) is True
    assert ttft_p50(0.2) is True
    assert ttft_p50(0.024) is False  # two buckets below
    assert ttft_p50(0.4) is False  # two buckets above
    assert ttft_p50(0.7) is False  # +Inf bucket: never reported above 0.5 by Prometheus


def test_clean_run_at_bucket_resolution_agrees() -> None:
    """Issue 9: exact P99 152.7 ms and Prometheus 207 ms at 50 ms buckets is no disagreement."""
    bounds = (*(0.05 * k for k in range(1, 21)), float("inf"))
    ttfts = [0.1] * 98 + [0.1527, 0.1527]  # P99 at h = 98.01: 152.7 ms
    records = [rec(i, sent=T0 + i * 0.1, ttft=t, e2e=0.3) for i, t in enumerate(ttfts)]
    prom = PromClientSide(ttft_p99=0.207, ttft_buckets=bounds)
    cc = _check(records, Window(T0, T0 + 20), prom)
    q = {x.name: x for x in cc.quantiles}["ttft_p99"]
    assert q.exact == pytest.approx(0.1527) and q.agree is True and cc.agree is True
    assert (q.low, q.high) == pytest.approx((0.1, 0.25))


def test_exact_is_the_summary_figure_over_requests_sent_in_the_window() -> None:
    """The cross-check shows the latency table's number, not one over another set of requests."""
    window = Window(T0, T0 + 20)
    early = [rec(900 + i, sent=T0 - 1.0, ttft=0.4, e2e=1.5) for i in range(120)]  # end inside
    records = early + _records()
    prom = PromClientSide(ttft_p50=0.06, ttft_buckets=BOUNDS)
    q = {x.name: x for x in _check(records, window, prom).quantiles}
    assert q["ttft_p50"].exact == latencies(sent_in(records, window)).ttft.p50
    assert q["ttft_p50"].exact == pytest.approx(0.06)
    # ...and the band also covers what Prometheus counted: ended inside, median 0.4 s.
    assert q["ttft_p50"].high == pytest.approx(0.5)


def test_no_exporter_series() -> None:
    cc = _check(_records(), Window(T0, T0 + 20), PromClientSide())
    assert cc.counts == () and cc.agree is None
    assert "no lbtune_requests_total series" in cc.notes[0]


def test_a_thin_tail_reaches_the_buckets_of_requests_from_before_the_window() -> None:
    """A real run: 107 TTFTs up to 34.3 ms ended in the window, one of 56.4 ms just before.

    ``increase()`` extrapolated the (0.05, 0.06] bucket's counter, which held that earlier
    request, a little further than the one below: Prometheus' P99 came out at 50.03 ms.
    """
    bounds = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125)
    ttfts = [0.02 + 0.0001 * i for i in range(101)] + [0.033, 0.0335, 0.0336, 0.0338, 0.034, 0.0343]
    window = Window(T0, T0 + 11)
    inside = [rec(i, sent=T0 + i * 0.09, ttft=t, e2e=0.1) for i, t in enumerate(ttfts)]
    early = rec(500, sent=T0 - 0.5, ttft=0.0564, e2e=0.2)  # ended before the window
    prom = PromClientSide(ttft_p99=0.05003, ttft_buckets=bounds)
    q = {x.name: x for x in _check([early, *inside], window, prom).quantiles}["ttft_p99"]
    assert q.exact == pytest.approx(0.0343, abs=0.001) and q.agree is True
    assert (q.low, q.high) == pytest.approx((0.025, 0.06))
    # Without a request that could explain it, 50.03 ms is a disagreement.
    q = {x.name: x for x in _check(inside, window, prom).quantiles}["ttft_p99"]
    assert q.agree is False and q.high == pytest.approx(0.05)
