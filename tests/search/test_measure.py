"""Scoring a trial from its records: unfinished requests are censored, not forgiven, at a
checkpoint exactly as at the end; one estimator (linear P99) with its bootstrap interval."""

from __future__ import annotations

import pytest

from lbtune.metrics.censor import censored_samples
from lbtune.records.quantiles import percentile
from lbtune.records.requests import OpenRequest, Outcome, RequestRecord
from lbtune.search.tail import partial_figures, tail_figures


def rec(
    i: int, outcome: Outcome, sent: float, end: float, first: float | None, stream: bool = True
) -> RequestRecord:
    return RequestRecord(
        request_id=str(i),
        index=i,
        model="m",
        api="chat",
        stream=stream,
        sent_at=sent,
        ended_at=end,
        outcome=outcome,
        first_token_at=first,
    )


def test_partial_figures_count_only_real_errors() -> None:
    records = [
        rec(0, "ok", 0.0, 1.0, 0.1),
        rec(1, "ok", 0.5, 1.5, 0.6),
        rec(2, "cancelled", 1.0, 9.0, 1.5),
        rec(3, "timeout", 1.0, 9.0, None),
    ]
    fig = partial_figures(records, 0.0, 5.0, now=20.0)
    assert fig is not None
    assert fig.error_rate == 1 / 3  # cancelled: neither success nor error
    assert fig.completed == 2 and fig.samples == 3 and fig.censored == 1


def _round_robin_over_a_slow_replica(n: int = 90) -> list[RequestRecord]:
    """Every third request lands on a slow replica and takes 20 s; the others take 1 s."""
    return [
        rec(i, "ok", i * 0.1, i * 0.1 + (20.0 if i % 3 == 0 else 1.0), i * 0.1 + 0.05)
        for i in range(n)
    ]


def test_a_checkpoint_counts_the_requests_still_running() -> None:
    records = _round_robin_over_a_slow_replica()
    now = 8.0  # no slow request has finished yet
    ended = [r for r in records if r.ended_at <= now]
    open_now = [OpenRequest(r.sent_at, 0.05, True) for r in records if r.sent_at < now < r.ended_at]
    assert open_now and all(
        r.e2e == pytest.approx(1.0) for r in ended
    )  # finished-only would say P99 = 1 s
    # What the generator knows at `now`: the finished records and the open requests.
    fig = partial_figures(ended, 0.0, 9.0, now=now, open_requests=tuple(open_now))
    final = partial_figures(records, 0.0, 9.0, now=100.0)
    assert fig is not None and final is not None
    assert fig.censored == len(open_now)
    assert fig.samples == sum(r.sent_at < now for r in records)  # not yet sent: not yet there
    assert fig.p99_e2e_s >= now - records[0].sent_at - 0.5  # the oldest open one, censored
    assert final.p99_e2e_s == pytest.approx(20.0)
    assert fig.p99_e2e_s >= 0.35 * final.p99_e2e_s  # was 1/20 with finished requests only
    # A record read after the snapshot that ends after `now` is open at `now` as well.
    late = partial_figures(records, 0.0, 9.0, now=now)
    assert late is not None and late.p99_e2e_s == fig.p99_e2e_s


def test_the_final_and_intermediate_estimator_is_the_linear_percentile() -> None:
    records = [rec(i, "ok", float(i), float(i) + 1 + i / 100, float(i) + 0.1) for i in range(120)]
    cs = censored_samples(records, start=0.0, end=200.0)
    tail = tail_figures(cs)
    assert tail is not None and tail.p99_e2e_ci is not None and tail.p99_ttft_ci is not None
    assert tail.p99_e2e_s == percentile(cs.e2e, 99)  # linear, not nearest rank
    lo, hi = tail.p99_e2e_ci
    assert lo <= tail.p99_e2e_s <= hi and lo < hi
    assert tail.samples == 120


def test_nothing_streamed_e2e_stands_in_for_ttft() -> None:
    records = [rec(i, "ok", float(i), float(i) + 2.0, None, stream=False) for i in range(10)]
    tail = tail_figures(censored_samples(records, start=0.0, end=20.0))
    assert tail is not None and tail.p99_ttft_s == tail.p99_e2e_s == 2.0


def test_no_sample_no_figures() -> None:
    assert partial_figures([rec(0, "timeout", 0.0, 1.0, None)], 0.0, 5.0, now=2.0) is None


def test_refusing_the_slowest_requests_does_not_lower_the_tail() -> None:
    """A config that answers its 2 % slowest requests with a 429 (in 1 ms) instead of
    serving them in 10 s: each refusal counts as unanswered until the window closes (and
    no faster than the slowest served), so its P99s are worse than serving them, where
    with no sample for an error they were 10x better."""
    served = [rec(i, "ok", float(i), float(i) + 1.0 + (9.0 if i % 50 == 0 else 0.0),
                  float(i) + (0.9 if i % 50 == 0 else 0.1)) for i in range(200)]  # fmt: skip
    refused = [
        rec(r.index, "http_error", r.sent_at, r.sent_at + 0.001, None) if r.index % 50 == 0 else r
        for r in served
    ]
    honest = tail_figures(censored_samples(served, start=0.0, end=300.0))
    shed_cs = censored_samples(refused, start=0.0, end=300.0)
    shed = tail_figures(shed_cs)
    assert honest is not None and shed is not None
    assert shed_cs.errors == 4 and shed_cs.failed_open_s == (300.0, 250.0, 200.0, 150.0)
    assert percentile(shed_cs.e2e, 99) == pytest.approx(1.0)  # the served ones alone
    assert shed.p99_e2e_s > honest.p99_e2e_s and shed.p99_ttft_s > honest.p99_ttft_s
    ttfts, e2es = shed_cs.scored()
    assert len(e2es) == len(ttfts) == len(shed_cs.e2e) + 4
    assert e2es[-4:] == (300.0, 250.0, 200.0, 150.0)
    # at a checkpoint, an error has been unanswered until `now` (never negative)
    early = censored_samples(refused, start=0.0, end=300.0, now=120.0)
    assert early.failed_open_s == (120.0, 70.0, 20.0)
