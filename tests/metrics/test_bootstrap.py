"""The Poisson bootstrap of run figures: point = summary, resamples vary around it."""

from __future__ import annotations

import numpy as np
import pytest

from lbtune.metrics.bootstrap import RunArrays, point, resample
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import Window
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo
from tests.metrics.records import rec

T0 = 1_700_000_000.0


def _records() -> list[RequestRecord]:
    out = []
    for i in range(200):
        sent = T0 + i * 0.1
        ttft = 0.03 + (i % 17) * 0.004
        chunks = tuple(sent + ttft + 0.01 * j * (1 + i % 3) for j in range(5))
        e2e = chunks[-1] - sent + 0.001
        out.append(rec(i, sent=sent, ttft=ttft, e2e=e2e, chunks=chunks, output_tokens=5 + i % 4))
    out += [rec(500 + j, sent=T0 + 3 + j, ttft=None, e2e=0.5, outcome="timeout") for j in range(4)]
    out.append(rec(900, sent=T0 + 15, ttft=None, e2e=9.0, outcome="cancelled"))
    return out


def test_point_estimates_equal_summarize() -> None:
    window, slo = Window(T0 + 2, T0 + 18), Slo(ttft_s=0.07, e2e_s=0.2)
    recs = _records()
    s = summarize(recs, run_start=T0, window=window, scenario="x", target="t", slo=slo)
    p = point(RunArrays.from_records(recs, window, slo))
    assert p["ttft_p50"] == s.latency.ttft.p50
    assert p["ttft_p99"] == s.latency.ttft.p99
    assert p["e2e_p99"] == s.latency.e2e.p99
    assert p["itl_p50"] == s.latency.itl.p50
    assert p["requests_per_s"] == pytest.approx(s.throughput.requests_per_s)
    assert p["output_tokens_per_s"] == pytest.approx(s.throughput.output_tokens_per_s)
    assert p["goodput_per_s"] == pytest.approx(s.throughput.goodput_per_s)
    assert p["error_rate"] == pytest.approx(s.outcomes.error_rate)


def test_pooled_runs_resample_within_each_run_and_are_seeded() -> None:
    window = Window(T0 + 2, T0 + 18)
    one = RunArrays.from_records(_records(), window)
    both = RunArrays.concat([one, one])
    assert both.size == 2 * one.size and both.window_s == 2 * one.window_s
    assert both.itl_owner.max() == one.size + one.itl_owner.max()
    assert point(both)["requests_per_s"] == pytest.approx(point(one)["requests_per_s"])
    assert point(both)["goodput_per_s"] is None  # no SLO given
    a = resample(both, 300, np.random.default_rng(1))
    b = resample(both, 300, np.random.default_rng(1))
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
    rps = a["requests_per_s"]
    assert rps.std() > 0  # counts vary under the Poisson bootstrap
    mean = point(both)["requests_per_s"]
    assert mean is not None and abs(rps.mean() / mean - 1) < 0.05


def test_point_withholds_a_percentile_below_its_minimum_samples() -> None:
    """Like summary.json: 50 requests give a P50 but no P99 (it needs 100)."""
    recs = [rec(i, sent=T0 + i * 0.1, ttft=0.01 * (i + 1), e2e=1.0) for i in range(50)]
    window = Window(T0, T0 + 10)
    p = point(RunArrays.from_records(recs, window))
    s = summarize(recs, run_start=T0, window=window, scenario="x", target="t")
    assert p["ttft_p99"] is None and p["e2e_p99"] is None and s.latency.ttft.p99 is None
    assert p["ttft_p50"] == s.latency.ttft.p50 and p["ttft_p50"] is not None
