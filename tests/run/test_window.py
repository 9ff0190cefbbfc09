"""One window formula per run: the live consumers (``--until-samples``, a study's pruning
windows) and the summary use the window of the run plan (:meth:`RunPlan.window_at`),
anchored on the run's start as the runner knows it, and the summary reads the window
recorded once in the plan as run (``run.json``).

The snapshots below start their run at t = 1000 s while the wall clock is now: a consumer
that re-derived the run's start from the clock (``time.time() - elapsed``) would open its
window decades later and see nothing.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from lbtune.loadgen.collect import Progress
from lbtune.loadgen.health import GeneratorHealth
from lbtune.loadgen.recordio import write_parquet
from lbtune.loadgen.runner import LoadResult
from lbtune.metrics.censor import occupies
from lbtune.objective import Figures
from lbtune.records.requests import RequestRecord
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.run.summary import RunFacts, summarize_run
from lbtune.run.target import ResolvedTarget
from lbtune.run.until import WindowCounter
from lbtune.scenario.runplan import RunPlan
from lbtune.tune.harness import WindowFeed
from tests.metrics.records import rec

T0 = 1000.0
"""The run's start in these tests (the runner's anchor), far from the wall clock."""


@pytest.fixture(scope="module")
def plan() -> RunPlan:
    return plan_run(StressOptions(scenario="chat", duration_s=20))


def _records(plan: RunPlan) -> list[RequestRecord]:
    """One ok request a second over the whole run: some before the window, most in it."""
    return [rec(i, sent=T0 + i + 0.25, e2e=0.5) for i in range(int(plan.load.duration_s))]


def _in_window(records: list[RequestRecord], window: tuple[float, float]) -> int:
    return sum(1 for r in records if window[0] <= r.sent_at < window[1])


def _snapshot(elapsed: float, records: list[RequestRecord]) -> Progress:
    return Progress(
        elapsed_s=elapsed,
        remaining_s=0.0,
        sent=len(records),
        completed=len(records),
        requests_per_s=1.0,
        output_tokens_per_s=10.0,
        ttft_p50_s=0.05,
        ttft_p99_s=0.05,
        errors=0,
        in_flight=0,
        generator_lag_p99_s=None,
        generator_cpu_percent=None,
        now=T0 + elapsed,
        started_at=T0,
        records=tuple(records),
    )


def test_until_samples_pruning_and_the_summary_use_one_window(
    plan: RunPlan, tmp_path: Path
) -> None:
    assert plan.window_start_s > 0  # a warm-up: a window apart from the run
    records = _records(plan)
    ended = T0 + plan.load.duration_s
    planned = plan.window_at(T0)
    need = _in_window(records, planned)
    assert 0 < need < len(records)
    # Two snapshots: one inside the window (a pruning checkpoint), one after the shape.
    at = plan.window_end_s - 0.1
    early = [r for r in records if r.sent_at < T0 + at]
    snaps = [_snapshot(at, early), _snapshot(plan.load.duration_s - 0.5, records[len(early) :])]

    counter = WindowCounter(plan, need, threading.Event())
    seen: list[Figures] = []

    def hook(step: int, fig: Figures) -> bool:
        seen.append(fig)
        return False

    feed = WindowFeed(plan, 5.0, hook)
    for snap in snaps:
        counter(snap)
        feed(snap)
    ran = plan.as_run(T0, plan.measured_window(T0, ended)[:2])
    summary = summarize_run(
        RunFacts(ran, _load(tmp_path, records, ended), records), _no_target(), None
    )

    assert counter.window == feed.window == planned == ran.measured()
    assert (summary.window.start, summary.window.end) == planned
    # ... and each counted what lies in that window, nothing outside it.
    assert counter.reached_at is not None
    # (The pruning feed's samples follow the censoring rule: every request that occupies
    # the window, the one sent in the warm-up and still running when it opened included.)
    occupying = sum(1 for r in early if occupies(r.sent_at, r.ended_at, *planned))
    assert occupying == _in_window(early, planned) + 1
    assert len(seen) == 1 and seen[0].samples == occupying
    assert summary.outcomes.sent == need and summary.all_outcomes.sent == len(records)


def test_until_samples_counts_only_the_window(plan: RunPlan) -> None:
    records = _records(plan)
    need = _in_window(records, plan.window_at(T0)) + 1  # one more than the window holds
    counter = WindowCounter(plan, need, threading.Event())
    counter(_snapshot(plan.load.duration_s - 0.5, records))
    assert counter.reached_at is None


def test_the_live_window_follows_the_runners_start(plan: RunPlan) -> None:
    """The runner learns the generators' start after its own: each snapshot's start is the
    anchor, the same for every consumer."""
    counter = WindowCounter(plan, 10**6, threading.Event())
    feed = WindowFeed(plan, 5.0, lambda step, fig: False)
    for start in (T0, T0 + 0.75):
        snap = replace(_snapshot(3.0, []), started_at=start)
        counter(snap)
        feed(snap)
        assert counter.window == feed.window == plan.window_at(start)


def test_the_measured_window_is_cut_once_at_the_runs_end(plan: RunPlan) -> None:
    lo, hi = plan.window_at(T0)
    assert plan.measured_window(T0, T0 + 100.0) == (lo, hi, False)
    assert plan.measured_window(T0, hi - 2.0) == (lo, hi - 2.0, False)
    assert plan.measured_window(T0, T0 + 100.0, stopped_at=lo + 3.0) == (lo, lo + 3.0, False)
    # stopped before the window held a second: the whole run, warm-up included
    early = plan.measured_window(T0, lo + 0.5)
    assert early == (T0, lo + 0.5, True)
    assert plan.measured_window(T0, T0 + 0.2).end == T0 + 1.0


def _no_target() -> ResolvedTarget:
    return ResolvedTarget(
        url="http://127.0.0.1:9",
        prometheus_url=None,
        exporter_port=None,
        endpoints=None,
        cluster_started=False,
    )


def _load(tmp_path: Path, records: list[RequestRecord], ended: float) -> LoadResult:
    path = write_parquet(records, tmp_path / "requests.parquet")
    return LoadResult(
        records_dir=tmp_path,
        records_path=path,
        sent=len(records),
        outcomes={"ok": len(records)},
        health=GeneratorHealth(()),
        started_at=T0,
        ended_at=ended,
        stopped_early=False,
    )
