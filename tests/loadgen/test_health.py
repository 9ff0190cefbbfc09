"""Generator self-health rules, with hand-computed figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lbtune.loadgen.health import (
    WORKER_HEALTH,
    GeneratorHealth,
    HealthSample,
    WorkerHealth,
    assess,
    covering,
    health_json,
    percentile,
    summarize,
    timing_bound,
)
from lbtune.records import quantiles
from tests import golden


def test_percentile_is_the_one_estimator() -> None:
    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert percentile(xs, 99) == quantiles.percentile(xs, 99)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([], 50) is None


def test_open_loop_lateness_degrades() -> None:
    assert assess([0.001] * 100) == (False, [])
    degraded, why = assess([0.001] * 98 + [0.05, 0.05])
    assert degraded and "lateness" in why[0]


def test_starved_closed_loop_users_degrade() -> None:
    # 10 ms idle before each 1 s request: 1 % idle, healthy.
    w = summarize("w0", [], [], [], 0, idle=[(0.01, 1.0)] * 50)
    assert not w.degraded and w.idle_share == pytest.approx(0.01 / 1.01)
    # 100 ms before each 1 s request: 9 % less concurrency than asked.
    w = summarize("w0", [], [], [], 0, idle=[(0.1, 1.0)] * 50)
    assert w.degraded and "starved" in w.reasons[0] and w.idle_max_s == pytest.approx(0.1)


def test_timing_bound_is_the_quantile_interval() -> None:
    # 90 exact stamps at 50 ms, 10 coalesced at 60 ms that may really be 50 ms.
    ttfts = [0.05] * 90 + [0.06] * 10
    bounds = [0.0] * 90 + [0.01] * 10
    b = timing_bound(ttfts, bounds)
    assert b.ttft_p50_s == pytest.approx(0.05) and b.bound_p50_s == pytest.approx(0.0)
    assert b.ttft_p99_s == pytest.approx(0.06) and b.bound_p99_s == pytest.approx(0.01)
    assert b.inexact_share == pytest.approx(0.1)
    degraded, why = assess([], b)
    assert degraded and len(why) == 1 and "TTFT P99" in why[0]
    # All exact: nothing could be overstated, whatever the loop lag was.
    w = summarize("w0", [], [0.2] * 100, [], 0, ttfts=[(t, 0.0) for t in ttfts], timings=["kernel"])
    assert not w.degraded and w.ttft_bound_p99_s == 0.0 and w.timing == "kernel"


def test_the_bound_covers_the_per_request_errors_too() -> None:
    """2 % of stamps may be 10 ms late but sit mid-distribution: the P99 figure cannot
    move, yet the P99 of per-request errors may be 10 ms. The printed bound covers both."""
    ttfts = [0.05 + i * 1e-4 for i in range(100)]
    bounds = [0.01 if i in (40, 41) else 0.0 for i in range(100)]
    b = timing_bound(ttfts, bounds)
    low = [m - x for m, x in zip(ttfts, bounds, strict=True)]
    assert b.ttft_p99_s is not None
    assert b.ttft_p99_s - quantiles.percentile(low, 99) == pytest.approx(0.0)  # the figure
    assert b.bound_p99_s == pytest.approx(0.01) and b.bound_p50_s == pytest.approx(0.0)
    assert assess([], b)[0]


def test_the_write_is_not_a_late_read() -> None:
    """Every bound holds the write's duration; only the stamp's own part says a first
    token was read late, and only that part may print the "read late" hint."""
    ttfts = [(0.05, 0.006)] * 100  # a 6 ms write each (a busy process), 50 ms TTFTs
    w = summarize(
        "w0", [], [0.03] * 100, [], 0, ttfts=ttfts, timings=["kernel"], read_bounds=[0.0] * 100
    )
    assert w.degraded and w.inexact_share == 0.0
    assert not any("read late" in r for r in w.reasons)
    late = summarize(
        "w0", [], [0.03] * 100, [], 0, ttfts=ttfts, timings=["kernel"], read_bounds=[0.001] * 100
    )
    assert late.inexact_share == 1.0 and any("read late" in r for r in late.reasons)


def test_loop_stamped_records_are_counted() -> None:
    ttfts = [(0.05, 0.0)] * 99 + [(0.05, 0.04)]
    w = summarize("w0", [], [], [], 0, ttfts=ttfts, timings=["kernel"] * 99 + ["loop"])
    assert w.loop_stamped_share == pytest.approx(0.01) and w.timing == "mixed"


def test_late_reads_say_what_to_do() -> None:
    """Kernel stamps, but 10 % of first tokens shared their read (read late, 40 ms of
    loop lag): degraded, and the reasons say why and what to change."""
    ttfts = [(0.05, 0.0)] * 90 + [(0.09, 0.04)] * 10
    w = summarize("w0", [], [0.04] * 100, [], 0, ttfts=ttfts, timings=["kernel"])
    assert w.degraded and w.reasons[0].startswith("TTFT P99")
    assert "10% of first tokens were read late" in w.reasons[-1] and "--workers" in w.reasons[-1]


def test_loop_timed_stamps_are_bounded_by_the_loop_lag() -> None:
    """TLS (loop-timed): a 20 ms loop lag P99 may be in every 100 ms TTFT stamp."""
    ttfts = [(0.1, None)] * 100
    w = summarize("w0", [], [0.02] * 100, [], 0, ttfts=ttfts, timings=["loop"])
    assert w.degraded and w.ttft_bound_p50_s == pytest.approx(0.02) and w.timing == "loop"
    w = summarize("w0", [], [0.001] * 100, [], 0, ttfts=ttfts, timings=["loop"])
    assert not w.degraded  # 1 ms of 100 ms


def test_load_reasons_leave_out_the_ttft_bound() -> None:
    """A worker degraded only by its TTFT bound has no load reason; starved users and
    cap hits are load reasons, each with the text :attr:`reasons` gives them."""
    ttfts = [(0.015, 0.0)] * 90 + [(0.03, 0.012)] * 10
    late = summarize("w0", [], [0.04] * 100, [], 0, ttfts=ttfts, timings=["kernel"])
    assert late.degraded and late.load_reasons == ()
    starved = summarize(
        "w1", [], [], [], cap_hits=2, ttfts=ttfts, timings=["kernel"], idle=[(1.0, 4.0)]
    )
    assert starved.load_reasons == tuple(
        r for r in starved.reasons if not r.startswith("TTFT") and "read late" not in r
    )
    assert len(starved.load_reasons) == 2 and "starved" in starved.load_reasons[0]
    g = GeneratorHealth((late, starved))
    assert g.load_reasons == tuple(f"w1: {r}" for r in starved.load_reasons)


def test_small_bounds_below_the_floor_do_not_degrade() -> None:
    """A 0.5 ms bound on a 5 ms TTFT is 10 % but under the 1 ms floor."""
    b = timing_bound([0.005] * 100, [0.0005] * 100)
    assert assess([], b) == (False, [])


def test_cap_hits_degrade_and_workers_combine() -> None:
    w = summarize("w0", [0.0], [0.0], [], cap_hits=3)
    assert w.degraded and "in-flight cap" in w.reasons[0]
    ok = summarize("w1", [], [], [], 0, ttfts=[(0.05, 0.0008)] * 100, timings=["kernel"])
    g = GeneratorHealth((w, ok))
    assert g.degraded and g.reasons == ("w0: " + w.reasons[0],)
    assert g.ttft_bound_p99_s == pytest.approx(0.0008) and g.timing == "kernel"
    d = json.loads(health_json(g))
    assert d["degraded"] and d["ttft_bound_p99_s"] == pytest.approx(0.0008)


def workers() -> tuple[WorkerHealth, WorkerHealth]:
    """Two generator processes (fixed pids): one degraded, with per-second samples."""
    samples = [
        HealthSample(
            1_700_000_000.0 + i, "w0", 50.0 + i, 0.001, 0.004, None if i else 0.02, 8, 10 * i,
            9 * i, 0,
        )
        for i in range(3)
    ]  # fmt: skip
    w0 = summarize("w0", [0.001, 0.03, 0.002], [0.001, 0.002], samples, cap_hits=2)
    w1 = summarize("w1", [], [], [], 0, ttfts=[(0.05, 0.0008)] * 100, timings=["kernel"])
    return replace(w0, pid=101), replace(w1, pid=102)


def test_health_json_is_the_golden_text() -> None:
    """``health.json``: the computed verdict first, then every worker with every field."""
    text = health_json(GeneratorHealth(workers()))
    assert text == golden.expected("health.json", text)


def test_a_worker_report_crosses_the_pipe_unchanged() -> None:
    """A worker's final report (one JSON line on its stdout) reads back as it was sent."""
    for w in workers():
        line = json.dumps(WORKER_HEALTH.dump_python(w, mode="json"))
        assert WORKER_HEALTH.validate_python(json.loads(line)) == w
    text = json.dumps(WORKER_HEALTH.dump_python(w, mode="json")) + "\n"
    assert text == golden.expected("worker-health.jsonl", text)


def test_a_worker_report_without_reasons_or_samples_reads() -> None:
    doc = WORKER_HEALTH.dump_python(workers()[1], mode="json")
    doc["reasons"], doc["samples"] = None, None
    assert WORKER_HEALTH.validate_python(doc) == workers()[1]
    del doc["reasons"], doc["samples"]
    assert WORKER_HEALTH.validate_python(doc) == workers()[1]


def test_a_bound_near_the_p99_edge_covers_a_window_of_the_run_too() -> None:
    """0.9 % of 1000 first tokens inexact by 10 ms: the P99 of these bounds is 0, yet the
    last 500 requests (where all nine fall: 1.8 %) have a 10 ms P99 error. The printed
    bound is read a sampling margin above P99, so it covers them; a clean run keeps 0."""
    ttfts = [0.05] * 1000
    bounds = [0.0] * 991 + [0.01] * 9
    assert quantiles.percentile(bounds, 99) == 0.0  # in-sample, the edge falls on exact ones
    assert quantiles.percentile(bounds[500:], 99) == pytest.approx(0.01)
    b = timing_bound(ttfts, bounds)
    assert b.bound_p99_s == pytest.approx(0.01)
    assert 99.0 < covering(99, 1000) < 99.6 and covering(99, 10) == 100.0
    assert covering(50, 100_000) == pytest.approx(50.26, abs=0.01)
    assert timing_bound(ttfts, [0.0] * 1000).bound_p99_s == 0.0
