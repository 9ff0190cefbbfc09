"""Pruning acts on the trial lengths the defaults produce (issue 22): 15 s and 30 s trials
of the default scenario get at least two checkpoints inside the measured window, and the
study's pruner stops a clearly bad trial at the second; a window too short for two
checkpoints is said at the study's start.

The checkpoints are fed exactly as in a real trial: :class:`lbtune.tune.harness.
WindowFeed` over the study's run plan (:func:`lbtune.run.plan.plan_run`, ``mixed``),
progress snapshots once a second on the runner's clock carrying the records that ended
since the last one and the requests still open, and the study loop's own window hook
(intermediate values and their intervals reported to Optuna, the interval-vs-median
pruner asked).
"""

from __future__ import annotations

import optuna
import pytest

from lbtune.loadgen.collect import Progress
from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.requests import OpenRequest, RequestRecord
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario.runplan import RunPlan
from lbtune.search.pruning import MIN_SPACING_S, SNAPSHOT_S, checkpoints, make_pruner, pruning_line
from lbtune.search.study import LoopEvent, _window_hook
from lbtune.tune.harness import WindowFeed

optuna.logging.set_verbosity(optuna.logging.WARNING)

T0 = 1_000.0
"""The run's start on the runner's clock."""


def _quiet(e: LoopEvent) -> None:
    return None


def _plan(seconds: float) -> RunPlan:
    return plan_run(StressOptions(scenario="mixed", duration_s=seconds))


def _records(plan: RunPlan, latency: float) -> list[RequestRecord]:
    """24 closed-loop users, each request ``latency`` s, for the whole run."""
    out: list[RequestRecord] = []
    for user in range(24):
        t = T0 + 0.04 * user
        while t < T0 + plan.load.duration_s:
            out.append(
                RequestRecord(
                    request_id=f"{user}-{len(out)}",
                    index=len(out),
                    model="m",
                    api="chat",
                    stream=True,
                    sent_at=t,
                    ended_at=t + latency,
                    outcome="ok",
                    first_token_at=t + latency / 3,
                )
            )
            t += latency
    return out


def _feed(plan: RunPlan, records: list[RequestRecord], hook: object) -> WindowFeed:
    """One trial: a snapshot every second until the run ends or the hook asks to stop."""
    feed = WindowFeed(plan, 5.0, hook)  # type: ignore[arg-type]
    seen = 0.0
    k = 1
    while k <= plan.load.duration_s:
        now = T0 + k * SNAPSHOT_S
        fresh = tuple(r for r in records if seen < r.ended_at <= now)
        still = tuple(
            OpenRequest(r.sent_at, None, True) for r in records if r.sent_at <= now < r.ended_at
        )
        p = Progress(
            elapsed_s=now - T0, remaining_s=plan.load.duration_s - (now - T0), sent=0,
            completed=0, requests_per_s=0.0, output_tokens_per_s=0.0, ttft_p50_s=None,
            ttft_p99_s=None, errors=0, in_flight=len(still), generator_lag_p99_s=None,
            generator_cpu_percent=None, now=now, open_requests=still, started_at=T0,
            records=fresh,
        )  # fmt: skip
        if feed(p):
            break
        seen, k = now, k + 1
    return feed


@pytest.mark.parametrize("seconds", [15.0, 30.0])
def test_default_trial_lengths_get_two_checkpoints_and_prune_at_the_second(seconds: float) -> None:
    plan = _plan(seconds)
    window = plan.window_end_s - plan.window_start_s
    at = checkpoints(window)
    assert len(at) >= 2 and at[-1] <= window - SNAPSHOT_S
    spec = ObjectiveSpec(refs={"e2e": 20.0, "ttft": 1.0, "decay": 0.12})
    study = optuna.create_study(pruner=make_pruner("median", n_references=3))
    good = _records(plan, 0.8)
    for _ in range(5):  # the references and two sampled trials, complete
        trial = study.ask()
        start = LoopEvent("start", trial.number, 0, 10, {}, "sampled")
        _feed(plan, good, _window_hook(trial, start, spec, True, _quiet))
        assert len(study.trials[trial.number].intermediate_values) == len(at)
        study.tell(trial, 1.0)
    trial = study.ask()
    steps: list[int] = []
    hook = _window_hook(trial, LoopEvent("start", 5, 5, 10, {}, "sampled"), spec, True, _quiet)

    def recording(step: int, fig: Figures) -> bool:
        steps.append(step)
        return hook(step, fig)

    feed = _feed(plan, _records(plan, 6.0), recording)  # every request 7.5x slower
    assert steps == [1, 2]  # window 1 is never pruned; stopped at window 2
    assert trial.should_prune()
    opened, closed = feed.window or (0.0, 0.0)
    assert opened + at[1] < closed  # inside the measured window, not at its end


def test_the_issue_case_a_10_s_window_gets_its_second_checkpoint_inside() -> None:
    """Every 5 s, a 10 s window's second checkpoint fell on its end and was skipped."""
    assert checkpoints(10.0) == (4.5, 9.0)
    assert checkpoints(18.75) == (5.0, 10.0, 15.0)  # the default 25 s trial: as before


def test_the_study_says_what_pruning_can_do() -> None:
    line = pruning_line("median", 11.25, n_references=3)
    assert line.startswith("pruning: checkpoints at 5, 10 s of each trial's 11.2 s window")
    short = pruning_line("median", 2.5)
    assert short.startswith("pruning cannot act: each trial's measured window is 2.5 s")
    assert f"{MIN_SPACING_S:g} s apart" in short and "--trial-duration" in short
    assert pruning_line("none", 20.0).startswith("pruning off (--pruner none)")
    assert "cannot prune a multi-objective" in pruning_line("median", 20.0, multi_objective=True)
