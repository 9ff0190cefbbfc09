"""Exact statistics on synthetic records, against hand-computed values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lbtune.metrics.stats import (
    latencies,
    outcomes,
    replica_stats,
    sent_in,
    summarize,
    throughput,
)
from lbtune.metrics.summary import Window
from lbtune.records.quantiles import latency_stats, p99_or_max, percentile
from lbtune.records.slo import Slo
from tests.metrics.records import rec

T0 = 1_000_000.0


def test_linear_percentiles_of_ten_known_ttfts() -> None:
    # TTFTs 10..100 ms, shuffled. Linear interpolation on sorted x[0..9]:
    # P50 at h = 9 * 0.5 = 4.5 -> x[4] + 0.5 * (x[5] - x[4]) = 50 + 5 = 55 ms.
    # P90 at h = 9 * 0.9 = 8.1 -> x[8] + 0.1 * (x[9] - x[8]) = 90 + 1 = 91 ms.
    ttfts = [0.03, 0.1, 0.01, 0.07, 0.05, 0.09, 0.02, 0.08, 0.04, 0.06]
    records = [rec(i, sent=T0 + i, ttft=t, e2e=0.5) for i, t in enumerate(ttfts)]
    ttft = latencies(records).ttft
    assert ttft.count == 10
    assert ttft.p50 == pytest.approx(0.055)
    assert ttft.p90 == pytest.approx(0.091)
    assert ttft.mean == pytest.approx(0.055)
    assert (ttft.min, ttft.max) == pytest.approx((0.01, 0.1))
    # P95 needs 20 samples, P99 100, P99.9 1000.
    assert ttft.p95 is None and ttft.p99 is None and ttft.p999 is None
    assert ttft.too_few_samples == ("p95", "p99", "p999")


def test_sample_count_rule_at_its_boundaries() -> None:
    assert latency_stats([1.0]).p50 is None
    assert latency_stats([1.0, 3.0]).p50 == 2.0
    hundred = latency_stats(float(i) for i in range(100))
    assert hundred.p99 == pytest.approx(98.01)  # h = 99 * 0.99 = 98.01
    assert hundred.p999 is None and hundred.too_few_samples == ("p999",)
    assert latency_stats(float(i) for i in range(1000)).p999 == pytest.approx(998.001)
    empty = latency_stats([])
    assert empty.count == 0 and empty.mean is None and len(empty.too_few_samples) == 5
    assert p99_or_max([0.1, 0.3, 0.2]) == (0.3, False)
    assert percentile([1.0, 2.0, 3.0, 4.0], 25) == pytest.approx(1.75)


def test_itl_tpot_and_latency_from_schedule() -> None:
    # Chunks at +0.1, +0.15, +0.3: ITLs 0.05 and 0.15.
    # TPOT = (E2E - TTFT) / (tokens - 1) = (0.3 - 0.1) / (5 - 1) = 0.05.
    r = rec(
        0,
        sent=T0,
        ttft=0.1,
        e2e=0.3,
        output_tokens=5,
        scheduled=T0 - 0.02,
        chunks=(T0 + 0.1, T0 + 0.15, T0 + 0.3),
    )
    r2 = rec(1, sent=T0 + 1, ttft=0.2, e2e=0.4, output_tokens=5, scheduled=T0 + 1 - 0.04)
    lat = latencies([r, r2])
    assert sorted(round(x, 9) for x in r.itls) == [0.05, 0.15]
    assert lat.itl.count == 3  # 2 gaps + 1 gap (default chunks: first token, end)
    assert lat.tpot.min == pytest.approx(0.05)
    assert lat.ttft_from_schedule is not None and lat.e2e_from_schedule is not None
    # From schedule: TTFT 0.12 and 0.24, mean 0.18; E2E 0.32 and 0.44.
    assert lat.ttft_from_schedule.mean == pytest.approx(0.18)
    assert lat.e2e_from_schedule.max == pytest.approx(0.44)
    assert latencies([rec(0, sent=T0)]).ttft_from_schedule is None  # closed loop


def test_window_keeps_only_requests_sent_inside() -> None:
    # Warm-up request at T0+0.5 (TTFT 9 s), cool-down one at T0+9.5; window [T0+1, T0+9).
    records = [rec(0, sent=T0 + 0.5, ttft=9.0, e2e=9.5)]
    records += [rec(i, sent=T0 + i, ttft=0.01 * i, e2e=1.0) for i in range(1, 9)]
    records += [rec(9, sent=T0 + 9.0, ttft=5.0, e2e=6.0)]  # end is exclusive
    window = Window(T0 + 1, T0 + 9)
    inside = sent_in(records, window)
    assert [r.index for r in inside] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert latencies(inside).ttft.max == pytest.approx(0.08)


def test_throughput_and_goodput() -> None:
    # Window [T0, T0+10). Ten ok requests ending at T0+1..T0+10 (the last one outside),
    # 10 output tokens each, and an HTTP error ending inside.
    # TTFTs: i * 0.01 for i=1..10; SLO TTFT 0.055 s and E2E 0.6 s.
    records = [rec(i, sent=T0 + i - 0.5, ttft=0.01 * i, e2e=0.5) for i in range(1, 11)]
    records.append(rec(99, sent=T0 + 2, ttft=None, e2e=0.1, outcome="http_error"))
    tput = throughput(records, Window(T0, T0 + 10), Slo(ttft_s=0.055, e2e_s=0.6))
    assert tput.completed == 9  # ended at T0+0.5+... : sent T0+9.5 ends T0+10 (outside)
    assert tput.requests_per_s == pytest.approx(0.9)
    assert tput.output_tokens == 90 and tput.output_tokens_per_s == pytest.approx(9.0)
    # Meeting the SLO among the 9 completed: TTFT 0.01..0.05 -> 5 requests.
    assert tput.goodput_requests == 5 and tput.goodput_per_s == pytest.approx(0.5)
    # Sent in the window: 10 ok (T0+0.5..T0+9.5) + 1 error = 11.
    assert tput.sent_per_s == pytest.approx(1.1)
    assert throughput(records, Window(T0, T0 + 10), None).goodput_per_s is None


def test_every_request_in_exactly_one_outcome() -> None:
    kinds = ["ok"] * 6 + ["http_error"] * 2 + ["timeout", "broken_stream"]
    records = [rec(i, sent=T0 + i, outcome=k) for i, k in enumerate(kinds)]  # type: ignore[arg-type]
    out = outcomes(records)
    assert out.sent == 10 == sum(out.counts.values())
    assert dict(out.counts) == {
        "ok": 6,
        "http_error": 2,
        "broken_stream": 1,
        "timeout": 1,
        "connect_error": 0,
        "cancelled": 0,
    }
    assert out.error_rate == pytest.approx(0.4)
    assert out.rates["http_error"] == pytest.approx(0.2)
    assert outcomes([]).error_rate is None


def test_cancelled_requests_are_neither_successes_nor_errors() -> None:
    """Cut off by the test's end: 6 ok, 2 errors, 2 cancelled -> error rate 2 / 8."""
    kinds = ["ok"] * 6 + ["http_error"] * 2 + ["cancelled"] * 2
    records = [rec(i, sent=T0 + i, outcome=k) for i, k in enumerate(kinds)]  # type: ignore[arg-type]
    out = outcomes(records)
    assert out.sent == 10 == sum(out.counts.values())
    assert out.error_rate == pytest.approx(0.25)
    (only,) = replica_stats(records)
    assert only.errors == 2 and only.error_rate == pytest.approx(0.25)


def test_per_replica_share_errors_and_latency() -> None:
    records = [
        rec(0, sent=T0, replica="r0", ttft=0.1),
        rec(1, sent=T0 + 1, replica="r0", ttft=0.3),
        rec(2, sent=T0 + 2, replica="r0", outcome="timeout", ttft=None),
        rec(3, sent=T0 + 3, replica="r1", ttft=0.2),
        rec(4, sent=T0 + 4, replica=None, outcome="connect_error", ttft=None),
    ]
    reps = {r.replica: r for r in replica_stats(records)}
    assert list(reps) == ["r0", "r1", "unknown"]
    assert reps["r0"].share == pytest.approx(0.6) and reps["r1"].share == pytest.approx(0.2)
    assert reps["r0"].errors == 1 and dict(reps["r0"].errors_by_outcome) == {"timeout": 1}
    assert reps["r0"].error_rate == pytest.approx(1 / 3)
    assert reps["r0"].ttft_p50 == pytest.approx(0.2)  # two ok samples: 0.1 and 0.3
    assert reps["r0"].ttft_p99 is None and "ttft_p99" in reps["r0"].too_few_samples
    assert reps["r1"].ttft_p50 is None  # one sample
    assert reps["unknown"].errors_by_outcome == {"connect_error": 1}


def test_summarize_slo_checks_and_notes() -> None:
    records = [rec(i, sent=T0 + i * 0.1, ttft=0.01 * (i % 10 + 1), e2e=0.5) for i in range(100)]
    records.append(rec(100, sent=T0 + 5, outcome="timeout", ttft=None, e2e=30))
    s = summarize(
        records,
        run_start=T0,
        window=Window(T0, T0 + 10),
        scenario="chat",
        target="http://127.0.0.1:8000",
        slo=Slo(ttft_s=0.095, e2e_s=1.0),
    )
    checks = {c.name: c for c in s.slo_checks}
    # 100 ok TTFTs: ten each of 0.01..0.10; P99 at h = 98.01 -> 0.10 (x[98] = x[99]).
    assert checks["p99_ttft"].value == pytest.approx(0.1) and checks["p99_ttft"].ok is False
    assert checks["p99_e2e"].ok is True and checks["p99_e2e"].detail == ""
    assert checks["error_rate"].value == pytest.approx(1 / 101) and checks["error_rate"].ok
    assert s.mode == "closed" and s.lateness is None
    assert s.generator.lateness_p99_s is None and not s.incomplete
    assert s.outcomes.sent == 101 == s.all_outcomes.sent
    assert s.stages == () and s.throughput_decay is None and s.recovered is None
    empty = summarize([], run_start=T0, window=Window(T0, T0 + 1), scenario="x", target="y")
    assert "no request was sent in the measurement window" in empty.notes


def test_stats_import_stays_light() -> None:
    code = (
        "import sys, lbtune.metrics.stats, lbtune.metrics.serverside, lbtune.report; "
        "print(sorted(m for m in ('pandas', 'matplotlib', 'prometheus_api_client', 'requests') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_records_to_frame_has_derived_columns() -> None:
    from lbtune.metrics.stats import records_to_frame

    frame = records_to_frame([rec(0, sent=T0, ttft=0.1, e2e=0.5), rec(1, sent=T0 + 1)])
    assert list(frame["ttft"]) == pytest.approx([0.1, 0.05])
    assert {"e2e", "tpot", "lateness", "chunks", "replica"} <= set(frame.columns)


def test_open_loop_lateness_fills_generator_health() -> None:
    # 100 requests due every 0.1 s, sent i ms late (i = 0..99): lateness P99 at
    # h = 99 * 0.99 = 98.01 -> 98.01 ms.
    records = [
        rec(i, sent=T0 + i * 0.1 + i * 1e-3, scheduled=T0 + i * 0.1, ttft=0.05) for i in range(100)
    ]
    s = summarize(records, run_start=T0, window=Window(T0, T0 + 11), scenario="x", target="y")
    assert s.mode == "open" and s.lateness is not None
    assert s.lateness.p99 == pytest.approx(0.09801, abs=1e-6)
    assert s.generator.lateness_p99_s == s.lateness.p99
    assert s.latency.ttft_from_schedule is not None
    assert s.latency.ttft_from_schedule.max == pytest.approx(0.05 + 0.099, abs=1e-6)


def test_non_streamed_requests_have_no_ttft_but_count_for_e2e() -> None:
    """A whole body is not a first token: TTFT and TPOT come from streamed requests only."""
    import dataclasses

    streamed = [rec(i, sent=T0 + i, ttft=0.1, e2e=1.0) for i in range(3)]
    whole = dataclasses.replace(rec(3, sent=T0 + 3, ttft=4.0, e2e=4.0), stream=False)
    lat = latencies([*streamed, whole])
    assert lat.ttft.count == 3 and lat.ttft.max == pytest.approx(0.1)
    assert lat.tpot.count == 3
    assert lat.e2e.count == 4 and lat.e2e.max == pytest.approx(4.0)


def test_one_ttft_p99_in_the_summary() -> None:
    """Issue 9 item 6: latency table, SLO check and cross-check show the same TTFT P99.

    A mixed run: 120 streamed requests with TTFTs 10..1200 ms and 30 non-streamed ones
    of 3.2 s. The non-streamed ones have no TTFT, so they enter none of the three.
    """
    import dataclasses

    from lbtune.metrics.summary import PromClientSide, ServerSide

    streamed = [rec(i, sent=T0 + i * 0.1, ttft=0.01 * (i + 1), e2e=1.5) for i in range(120)]
    whole = [
        dataclasses.replace(
            rec(200 + i, sent=T0 + i * 0.3, ttft=None, e2e=3.2), stream=False, chunk_times=()
        )
        for i in range(30)
    ]
    window = Window(T0, T0 + 20)
    bounds = tuple(0.05 * k for k in range(1, 41))
    server = ServerSide(
        window=window,
        client=PromClientSide(ttft_p99=1.19, ttft_buckets=bounds, e2e_buckets=bounds),
    )
    s = summarize(
        streamed + whole,
        run_start=T0,
        window=window,
        scenario="mixed",
        target="t",
        slo=Slo(ttft_s=1.0),
        server=server,
        scrape_interval_s=1.0,
    )
    # 120 TTFTs 0.01..1.20: P99 at h = 119 * 0.99 = 117.81 -> 1.18 + 0.81 * 0.01 = 1.1881.
    expected = percentile([r.ttft for r in streamed if r.ttft is not None], 99)
    assert expected == pytest.approx(1.1881)
    assert s.latency.ttft.count == 120 and s.latency.ttft.p99 == expected
    check = {c.name: c for c in s.slo_checks}["p99_ttft"]
    assert check.value == expected and check.ok is False
    assert s.cross_check is not None
    cc = {q.name: q for q in s.cross_check.quantiles}["ttft_p99"]
    assert cc.exact == expected and cc.agree is True


def test_slo_check_without_streamed_requests() -> None:
    import dataclasses

    whole = [
        dataclasses.replace(rec(i, sent=T0 + i * 0.1, ttft=None, e2e=0.2), stream=False)
        for i in range(20)
    ]
    s = summarize(
        whole,
        run_start=T0,
        window=Window(T0, T0 + 10),
        scenario="x",
        target="y",
        slo=Slo(ttft_s=0.1),
    )
    check = {c.name: c for c in s.slo_checks}["p99_ttft"]
    assert check.value is None and check.ok is None and "no streamed request" in check.detail
