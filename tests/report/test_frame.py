"""Report frames: the pure data behind tables and plots, on hand-checked values."""

from __future__ import annotations

import dataclasses

import pytest

from lbtune.metrics.summary import GeneratorHealth
from lbtune.report import frame, series
from tests.report import data


def test_latency_over_time_bins_by_send_second() -> None:
    points = series.latency_over_time(data.records(), data.T0)
    assert [p.t for p in points] == [float(t) for t in range(30)]
    assert all(p.n == 10 for p in points)  # 10 successful requests per second
    # Second 0: TTFTs (ms) 40, 42, 46, 48, 52, 54, 58, 204, 210, 216 -> P50 = (52 + 54) / 2.
    assert points[0].ttft_p50_ms == pytest.approx(53.0, abs=1e-3)
    # P99 at h = 9 * 0.99 = 8.91 -> 210 + 0.91 * 6 = 215.46 ms.
    assert points[0].ttft_p99_ms == pytest.approx(215.46, abs=1e-3)
    assert points[0].e2e_p50_ms == pytest.approx(353.0, abs=1e-3)


def test_ttft_histogram_covers_the_window_only() -> None:
    s = data.summary()
    bins = series.ttft_histogram(data.records(), s, bins=20)
    assert len(bins) == 20
    assert sum(b.count for b in bins) == 280 == s.latency.ttft.count  # i = 20..299
    assert bins[0].lo_ms == pytest.approx(40.0, abs=1e-3)
    assert bins[-1].hi_ms == pytest.approx(218.0, abs=1e-3)


def test_throughput_vs_load_and_replica_points() -> None:
    s = data.summary()
    load = series.throughput_vs_load(s)
    assert [(p.label, p.offered_load) for p in load] == [
        ("4 users", 4.0),
        ("8 users", 8.0),
        ("16 users", 16.0),
    ]
    assert [p.meets_slo for p in load] == [False, True, True]  # stage 0: 3 errors of 103
    assert s.knee_offered_load == 16.0
    reps = series.replica_load(s)
    assert [r.replica for r in reps] == ["r0", "r1", "r2"]
    # Window: i = 20..299 -> r2 gets 94, r0 93, r1 93 ok + 3 errors; 283 sent.
    assert [r.share_pct for r in reps] == pytest.approx([9300 / 283, 9600 / 283, 9400 / 283])
    assert reps[2].busy_pct == pytest.approx(90.0)
    assert sum(r.share_pct for r in reps) == pytest.approx(100.0)
    no_stages = dataclasses.replace(s, stages=())
    (only,) = series.throughput_vs_load(no_stages)
    assert only.label == "window" and only.offered_load == pytest.approx(283 / 28)


def test_tables_hold_the_key_figures() -> None:
    s = data.summary()
    head = {row[0]: row[1] for row in frame.headline(s).rows}
    assert head["Requests sent (window)"] == 283
    assert head["Error rate"] == pytest.approx(300 / 283)
    assert head["Replica balance (std-dev)"] == 0.245
    assert head["Prefix-cache hit rate"] == pytest.approx(42.0)
    outcomes = {row[0]: row[1] for row in frame.outcome_table(s).rows}
    assert outcomes == {
        "ok": 280,
        "http_error": 3,
        "broken_stream": 0,
        "timeout": 0,
        "connect_error": 0,
        "cancelled": 0,
        "sent": 283,
    }
    slo = {row[0]: row[3] for row in frame.slo_table(s).rows}
    assert slo == {"p99_ttft": "pass", "p99_e2e": "pass", "error_rate": "FAIL"}
    lat = frame.latency_table(s)
    assert lat.rows[0][0] == "TTFT" and lat.rows[0][1] == 280
    assert [r[0] for r in frame.stage_table(s).rows] == [0, 1, 2]
    cc = {row[0]: row[4] for row in frame.crosscheck_table(s).rows}
    assert cc["requests ok"] == "agree" and cc["ttft_p99 (ms)"] == "agree"
    server = frame.server_table(s)
    assert server.rows[2][0] == "r2"
    assert dict(zip(server.columns, server.rows[2], strict=True))["SM active (%)"] == (
        pytest.approx(60.0)
    )


def test_warnings_come_first_and_name_the_problem() -> None:
    s = data.summary()
    assert frame.warnings(s) == ["SLO NOT MET: error_rate."]
    bad = data.summary(
        generator=GeneratorHealth(degraded=True, reasons=("lateness P99 25 ms > 10 ms",)),
        incomplete=True,
    )
    w = frame.warnings(bad)
    assert w[0].startswith("DEGRADED") and "lateness P99 25 ms" in w[0]
    assert w[1].startswith("INCOMPLETE")


def test_cross_check_warning_names_the_figure_both_values_and_the_tolerance() -> None:
    from lbtune.metrics.summary import CountCheck, CrossCheck, QuantileCheck

    q = QuantileCheck(
        "ttft_p99",
        0.06,
        0.3,
        0.05,
        False,
        "records 60.0 ms, Prometheus 300.0 ms, tolerance 25.0 ms to 250.0 ms",
        0.025,
        0.25,
    )
    cc = CrossCheck(
        counts=(CountCheck("ok", 100, 60.0, 11.0, False), CountCheck("timeout", 3, 3.0, 1.6, True)),
        quantiles=(q,),
        agree=False,
    )
    s = dataclasses.replace(data.summary(), cross_check=cc)
    (w,) = [x for x in frame.warnings(s) if x.startswith("CROSS-CHECK")]
    assert w == (
        "CROSS-CHECK: records and Prometheus disagree: requests ok: records 100, "
        "Prometheus 60 (tolerance ±11.0); ttft_p99: records 60.0 ms, Prometheus 300.0 ms, "
        "tolerance 25.0 ms to 250.0 ms."
    )
    tol = {row[0]: row[3] for row in frame.crosscheck_table(s).rows}
    assert tol["ttft_p99 (ms)"] == "25.0 to 250.0 ms"
