"""Stages: decay, knee and spike recovery on synthetic records with hand-computed values."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lbtune.metrics.stages import knee, recovery_time, stage_stats, throughput_decay
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import Window
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo
from tests.metrics.records import rec

T0 = 2_000_000.0


@dataclass(frozen=True)
class Step:
    start_s: float
    end_s: float
    users: int | None
    rate: float | None
    label: str


def _stage_records(
    start: float, n: int, ttft: float, *, errors: int = 0, first: int = 0
) -> list[RequestRecord]:
    """``n`` ok requests sent evenly over a 10 s stage (ending inside it), then errors."""
    out = [rec(first + i, sent=T0 + start + i * (9.0 / n), ttft=ttft, e2e=0.5) for i in range(n)]
    out += [
        rec(first + n + j, sent=T0 + start + 1 + j * 0.01, outcome="http_error", ttft=None)
        for j in range(errors)
    ]
    return out


STEPS = [
    Step(0, 10, 10, None, "step"),
    Step(10, 20, 20, None, "step"),
    Step(20, 30, 40, None, "step"),
]


def test_decay_and_knee_over_three_steps() -> None:
    # Completed per stage: 50, 80, 60 requests in 10 s -> 5, 8, 6 req/s.
    # Decay = max(0, 1 - tput at peak load (40 users: 6) / best (8)) = 0.25.
    # SLO TTFT 0.2 s: stages 1 and 2 have TTFT 0.1, stage 3 has 0.4 -> knee = stage 2 (20 users).
    records = (
        _stage_records(0, 50, 0.1)
        + _stage_records(10, 80, 0.1, first=100)
        + _stage_records(20, 60, 0.4, first=200)
    )
    stats = stage_stats(records, STEPS, run_start=T0, slo=Slo(ttft_s=0.2, e2e_s=1.0))
    assert [s.throughput_rps for s in stats] == pytest.approx([5.0, 8.0, 6.0])
    assert [s.offered_load for s in stats] == [10.0, 20.0, 40.0]
    assert [s.meets_slo for s in stats] == [True, True, False]
    assert throughput_decay(stats) == pytest.approx(0.25)
    k = knee(stats)
    assert k is not None and k.index == 1 and k.offered_load == 20.0
    # Under 100 samples the SLO is judged on the maximum, and the stage says so.
    assert stats[0].ttft_p99 is None and "judged on the maximum" in stats[0].notes[0]
    assert stats[1].ttft_p99 is None


def test_error_rate_above_one_percent_fails_a_stage() -> None:
    # 99 ok + 2 errors in the stage: error rate 2/101 > 1 %.
    records = _stage_records(0, 99, 0.1, errors=2)
    (s,) = stage_stats(records, STEPS[:1], run_start=T0, slo=Slo(ttft_s=0.2))
    assert s.error_rate == pytest.approx(2 / 101) and s.meets_slo is False
    (s,) = stage_stats(records[:-1], STEPS[:1], run_start=T0, slo=Slo(ttft_s=0.2))
    assert s.error_rate == pytest.approx(1 / 100) and s.meets_slo is True


def test_decay_is_zero_when_throughput_keeps_rising() -> None:
    records = _stage_records(0, 10, 0.1) + _stage_records(10, 20, 0.1, first=100)
    stats = stage_stats(records, STEPS[:2], run_start=T0, slo=None)
    assert throughput_decay(stats) == 0.0
    assert knee(stats) is None and stats[0].meets_slo is None  # no SLO, no knee
    assert throughput_decay(()) is None


def _spike_run() -> list[RequestRecord]:
    # Spike stage [10, 20) s. After its end, one request every 0.1 s: TTFT 1.0 s until
    # (excluding) 23.0 s, then 0.1 s until 26 s.
    bad = [rec(i, sent=T0 + 20 + i / 10, ttft=1.0, e2e=1.5) for i in range(30)]
    good = [rec(100 + i, sent=T0 + 23 + i / 10, ttft=0.1, e2e=0.5) for i in range(31)]
    return bad + good


def test_recovery_time_after_a_spike() -> None:
    # Windows of 2 s start at 20 + k * 0.25. The window starting at 22.75 still holds the
    # requests sent at 22.8 and 22.9 (TTFT 1 s > SLO 0.5 s); the one at 23.0 holds only good
    # ones -> recovery 3.0 s.
    records = _spike_run()
    assert recovery_time(records, spike_end=T0 + 20, slo_ttft_s=0.5) == pytest.approx(3.0)
    # Never under the SLO: None.
    assert recovery_time(records, spike_end=T0 + 20, slo_ttft_s=0.05) is None


def test_failed_requests_count_against_recovery() -> None:
    # The slow requests time out instead: without them the first window would look fine.
    records = [
        rec(i, sent=T0 + 20 + i / 10, ttft=None, e2e=30, outcome="timeout") for i in range(30)
    ] + [rec(100 + i, sent=T0 + 23 + i / 10, ttft=0.1, e2e=0.5) for i in range(31)]
    assert recovery_time(records, spike_end=T0 + 20, slo_ttft_s=0.5) == pytest.approx(3.0)


def test_summarize_reports_recovery_and_knee() -> None:
    steady = [rec(500 + i, sent=T0 + i / 10, ttft=0.1, e2e=0.5) for i in range(100)]
    stages = [Step(0, 10, None, 5.0, "steady"), Step(10, 20, None, 41.5, "spike")]
    s = summarize(
        steady + _spike_run(),
        run_start=T0,
        window=Window(T0, T0 + 26),
        scenario="surge",
        target="t",
        slo=Slo(ttft_s=0.5, e2e_s=2.0),
        stages=stages,
    )
    assert s.recovery_s == pytest.approx(3.0) and s.recovered is True
    assert s.stages[1].recovery_s == pytest.approx(3.0)
    assert s.knee_stage == 0 and s.knee_offered_load == 5.0  # the spike stage sent nothing
    never = summarize(
        _spike_run(),
        run_start=T0,
        window=Window(T0, T0 + 26),
        scenario="surge",
        target="t",
        slo=Slo(ttft_s=0.05),
        stages=stages,
    )
    assert never.recovery_s is None and never.recovered is False


def test_stage_ttft_is_over_streamed_requests_only() -> None:
    """As in the latency table: a non-streamed response's E2E is no TTFT."""
    import dataclasses

    streamed = _stage_records(0, 100, 0.1)
    whole = [
        dataclasses.replace(r, stream=False, first_token_at=None, chunk_times=())
        for r in _stage_records(0, 20, 0.1, first=500)
    ]  # E2E 0.5 s each
    (st,) = stage_stats(streamed + whole, STEPS[:1], run_start=T0, slo=Slo(ttft_s=0.2))
    assert st.ttft_p99 == pytest.approx(0.1) and st.e2e_p99 == pytest.approx(0.5)
    assert st.meets_slo is True
    # A stage with no streamed request does not judge TTFT (E2E still is).
    (only,) = stage_stats(whole, STEPS[:1], run_start=T0, slo=Slo(ttft_s=0.2, e2e_s=1.0))
    assert only.ttft_p99 is None and only.meets_slo is True
    assert "no streamed request: TTFT not judged" in only.notes
