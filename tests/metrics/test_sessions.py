"""Agent-session figures (lbtune.metrics.sessions), checked against hand-computed values."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lbtune.metrics.sessions import busy_time, completion_times, session_stats
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import Window
from lbtune.metrics.summary_file import dumps, summary_from_data
from lbtune.records.quantiles import percentile
from lbtune.records.requests import Outcome, RequestRecord
from lbtune.scenario.sessionplan import call_index
from tests.metrics.records import rec

WINDOW = Window(100.0, 200.0)


def call(
    session: int,
    position: int,
    sent: float,
    ended: float,
    replica: str | None = "r0",
    outcome: Outcome = "ok",
) -> RequestRecord:
    r = rec(call_index(session, position), sent=sent, e2e=ended - sent, outcome=outcome)
    return replace(r, session_id=session, replica=replica)


def run() -> tuple[list[RequestRecord], dict[int, int]]:
    """A chain, a fan-out, a failed session, two unfinished ones, one started before the
    window, and a chat session (an id not planned): records and the planned call counts."""
    records = [
        # 0: a chain of 3 turns with tool delays between them.
        call(0, 0, 100.0, 101.0, "r0"),
        call(0, 1, 103.0, 104.5, "r0"),
        call(0, 2, 105.0, 107.0, "r1"),
        # 1: a call, two subagents in parallel, the rejoining call.
        call(1, 0, 110.0, 111.0, "r1"),
        call(1, 1, 111.5, 114.0, "r1"),
        call(1, 2, 111.5, 113.0, "r2"),
        call(1, 3, 115.0, 116.0, "r1"),
        # 2: its second call failed at the balancer (no replica header).
        call(2, 0, 120.0, 121.0, "r0"),
        call(2, 1, 122.0, 122.5, None, "http_error"),
        # 3: its second call was cut off by the run's end.
        call(3, 0, 190.0, 191.0, "r2"),
        call(3, 1, 192.0, 200.0, "r2", "cancelled"),
        # 5: one call of two sent when the run ended.
        call(5, 0, 195.0, 196.0, "r0"),
        # 4: started before the window: not counted, though its later call is in it.
        call(4, 0, 95.0, 96.0, "r0"),
        call(4, 1, 100.5, 101.0, "r1"),
        # a chat session (not an agent session): not planned, not counted.
        replace(rec(7, sent=150.0), session_id=99),
    ]
    return records, {0: 3, 1: 4, 2: 2, 3: 3, 4: 2, 5: 2}


def test_union_of_intervals_counts_overlaps_once() -> None:
    assert busy_time([]) == 0.0
    assert busy_time([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.6)]) == pytest.approx(3.0)
    assert busy_time([(3.0, 4.0), (0.0, 1.0), (1.0, 2.0)]) == pytest.approx(3.0)


def test_counts_times_and_affinity_by_hand() -> None:
    records, planned = run()
    s = session_stats(records, WINDOW, planned)
    assert (s.started, s.completed, s.failed, s.unfinished) == (5, 2, 1, 2)
    # completion: chain 107 - 100 = 7; fan-out 116 - 110 = 6.
    assert s.completion.count == 2
    assert s.completion.p50 == pytest.approx(6.5)
    assert s.completion.max == pytest.approx(7.0)
    # in the cluster: chain 1 + 1.5 + 2 = 4.5; fan-out 1 + [111.5, 114] + 1 = 4.5 (the
    # parallel subagent call [111.5, 113] not counted again: the plain sum would be 6).
    assert s.in_cluster.min == pytest.approx(4.5) and s.in_cluster.max == pytest.approx(4.5)
    assert s.waiting.min == pytest.approx(1.5) and s.waiting.max == pytest.approx(2.5)
    assert s.in_cluster_share == pytest.approx(9 / 13)
    assert s.calls_mean == pytest.approx(3.5)
    # after the first call: chain 1 of 2 on r0; fan-out 2 of 3 on r1; failed one's call
    # has no replica (left out); the cut-off call was on r2 like its first: 4 of 6.
    assert s.same_replica_share == pytest.approx(4 / 6)


def test_percentiles_are_the_project_estimator_with_its_sample_rule() -> None:
    records = []
    lengths = [1.0 + 0.25 * (k * 5 % 12) for k in range(12)]  # exact in binary, shuffled
    for k, length in enumerate(lengths):
        t = 100.0 + 5 * k
        records += [call(k, 0, t, t + 0.25), call(k, 1, t + length - 0.25, t + length)]
    s = session_stats(records, WINDOW, dict.fromkeys(range(12), 2))
    assert s.completed == 12
    assert s.completion.p50 == percentile(lengths, 50)
    assert s.completion.p90 == percentile(lengths, 90)
    assert s.completion.p99 is None and "p99" in s.completion.too_few_samples
    assert s.in_cluster.p50 == pytest.approx(0.5)
    assert s.same_replica_share == 1.0


def test_no_session_in_the_window() -> None:
    records, planned = run()
    s = session_stats(records, Window(300.0, 400.0), planned)
    assert (s.started, s.completed, s.failed, s.unfinished) == (0, 0, 0, 0)
    assert s.completion.count == 0 and s.completion.p50 is None
    assert s.in_cluster_share is None and s.calls_mean is None
    assert s.same_replica_share is None


def test_summarize_sets_sessions_and_the_summary_round_trips() -> None:
    records, planned = run()
    kwargs = dict(run_start=90.0, window=WINDOW, scenario="agents", target="t")
    plain = summarize(records, **kwargs)  # type: ignore[arg-type]
    assert plain.sessions is None
    summary = summarize(records, session_calls=planned, **kwargs)  # type: ignore[arg-type]
    assert summary.sessions == session_stats(records, WINDOW, planned)
    doc = json.loads(dumps(summary))
    assert list(doc)[-1] == "sessions" and doc["sessions"]["completed"] == 2
    assert summary_from_data(doc) == summary
    del doc["sessions"]  # a summary written before sessions existed
    assert summary_from_data(doc) == plain


def test_completion_times_are_the_samples_of_the_completion_figures() -> None:
    records, planned = run()
    times = completion_times(records, WINDOW, planned)
    assert times == [pytest.approx(7.0), pytest.approx(6.0)]  # sessions 0 and 1 completed
    stats = session_stats(records, WINDOW, planned)
    assert stats.completion.p50 == pytest.approx(percentile(times, 50))
