"""Cross-check of records against lbtune's exporter read back from Prometheus."""

from __future__ import annotations

import pytest

from lbtune.metrics.crosscheck import bucket_width, cross_check, resolution
from lbtune.metrics.summary import PromClientSide, Window
from tests.metrics.records import rec

T0 = 3_000_000.0
BOUNDS = (0.025, 0.05, 0.1, 0.25, 0.5, float("inf"))


def test_bucket_width_and_resolution() -> None:
    assert bucket_width(BOUNDS, 0.01) == 0.025  # (0, 0.025]
    assert bucket_width(BOUNDS, 0.05) == pytest.approx(0.025)  # (0.025, 0.05]: le is inclusive
    assert bucket_width(BOUNDS, 0.07) == pytest.approx(0.05)
    assert bucket_width(BOUNDS, 0.7) is None  # beyond the largest finite bound
    # Exact near an edge, estimate in the wider neighbouring bucket: the wider one counts.
    assert resolution(BOUNDS, 0.049, 0.06) == pytest.approx(0.05)
    assert resolution(BOUNDS, 0.049, 0.2) == pytest.approx(0.025)  # two buckets away
    assert resolution(BOUNDS, 0.7, 0.2) is None


def _records() -> list:  # type: ignore[type-arg]
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
    cc = cross_check(_records(), Window(T0, T0 + 20), prom, scrape_interval_s=1.0)
    counts = {c.outcome: c for c in cc.counts}
    # 100 ok in 20 s = 5 req/s; tolerance = 1 + 2 * 5 * 1 = 11.
    assert counts["ok"].client == 100 and counts["ok"].tolerance == pytest.approx(11.0)
    assert counts["timeout"].client == 3 and counts["connect_error"].prometheus == 0.0
    assert all(c.agree for c in cc.counts)
    assert all(q.agree for q in cc.quantiles) and cc.agree is True and cc.notes == ()


def test_disagreement_is_flagged() -> None:
    prom = PromClientSide(
        requests_by_outcome={"ok": 60.0, "timeout": 3.0},
        ttft_p99=0.3,  # exact 0.06 in (0.05, 0.1], estimate two buckets up: |0.24| > 0.05
        ttft_buckets=BOUNDS,
    )
    cc = cross_check(_records(), Window(T0, T0 + 20), prom, scrape_interval_s=1.0)
    assert cc.agree is False
    assert {c.outcome: c.agree for c in cc.counts}["ok"] is False
    assert any(n.startswith("requests ok: records 100, Prometheus 60") for n in cc.notes)
    q = {x.name: x for x in cc.quantiles}
    assert q["ttft_p99"].agree is False and q["ttft_p99"].resolution == pytest.approx(0.05)
    assert any(n.startswith("ttft_p99: exact 60.0 ms, Prometheus 300.0 ms") for n in cc.notes)
    assert q["e2e_p50"].agree is None and q["e2e_p50"].detail == "no histogram in Prometheus"


def test_quantile_outside_resolution() -> None:
    prom = PromClientSide(requests_by_outcome={"ok": 100.0, "timeout": 3.0},
                          ttft_p50=0.024, ttft_buckets=BOUNDS)  # fmt: skip
    cc = cross_check(_records(), Window(T0, T0 + 20), prom)
    q = {x.name: x for x in cc.quantiles}
    # Exact 0.06 in (0.05, 0.1] (width 0.05), estimate in (0, 0.025]: |0.036| <= 0.05 -> agree.
    assert q["ttft_p50"].agree is True
    prom = PromClientSide(requests_by_outcome={"ok": 100.0}, ttft_p50=0.2, ttft_buckets=BOUNDS)
    q = {x.name: x for x in cross_check(_records(), Window(T0, T0 + 20), prom).quantiles}
    # Estimate 0.2 in the neighbouring (0.1, 0.25] (width 0.15); |0.14| <= 0.15 -> agree.
    assert q["ttft_p50"].agree is True
    prom = PromClientSide(requests_by_outcome={"ok": 100.0}, ttft_p50=0.4, ttft_buckets=BOUNDS)
    q = {x.name: x for x in cross_check(_records(), Window(T0, T0 + 20), prom).quantiles}
    # Estimate 0.4 two buckets away: resolution stays 0.05; |0.34| > 0.05 -> flagged.
    assert q["ttft_p50"].agree is False and q["ttft_p50"].resolution == pytest.approx(0.05)
    prom = PromClientSide(requests_by_outcome={"ok": 100.0}, ttft_p50=0.7, ttft_buckets=BOUNDS)
    q = {x.name: x for x in cross_check(_records(), Window(T0, T0 + 20), prom).quantiles}
    assert q["ttft_p50"].agree is False  # estimate in +Inf: the exact's bucket width decides


def test_no_exporter_series() -> None:
    cc = cross_check(_records(), Window(T0, T0 + 20), PromClientSide())
    assert cc.counts == () and cc.agree is None
    assert "no lbtune_requests_total series" in cc.notes[0]
