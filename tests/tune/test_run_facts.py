"""A study's run facts are made once: the scenario read once, the run plan made once and
run by every trial, the SLO derived once (the plan's is the objective's), and each
trial's plan as it ran recorded in ``study.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import lbtune.run.plan
import lbtune.tune.harness
from lbtune.errors import NothingMeasured
from lbtune.run.stress import StressOptions
from lbtune.scenario import load_scenario
from lbtune.scenario.runplan import RunPlan
from lbtune.tune.harness import StressMeasure, plan_trials
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a scenario file by the run planner."""
    seen: list[str] = []

    def counted(ref: Any) -> Any:
        seen.append(str(ref))
        return load_scenario(ref)

    monkeypatch.setattr(lbtune.run.plan, "load_scenario", counted)
    return seen


def test_every_trial_runs_the_plan_made_once(
    reads: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials = plan_trials(OptimizeOptions(scenario="chat", trial_duration_s=12, seed=3))
    assert reads == ["chat"] and trials.plan is not None
    assert trials.plan.load.duration_s == 12 and trials.plan.seed == 3
    ran: list[RunPlan | None] = []

    def run_stress(opts: StressOptions, **_: Any) -> Any:
        ran.append(opts.plan)
        raise NothingMeasured("not a real run")

    monkeypatch.setattr(lbtune.tune.harness, "run_stress", run_stress)
    measure = StressMeasure(trials, tmp_path)
    for label in ("trial-0000", "trial-0001", "verify"):
        with pytest.raises(NothingMeasured):
            measure(label)
    assert len(ran) == 3 and all(p is trials.plan for p in ran)
    assert reads == ["chat"]  # no trial read the scenario again


def test_a_measurement_needs_its_plan(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plan"):
        StressMeasure(StressOptions(scenario="chat"), tmp_path)


def test_a_study_reads_its_scenario_once_and_scores_on_the_plans_slo(
    reads: list[str], tmp_path: Path
) -> None:
    target = FakeTarget()
    opts = study_options(tmp_path, budget=3, confirm_runs=0, scenario="chat", slo="e2e=3s")
    res = run_optimize(opts, harness=harness(target, FakeMeasure(target)))
    assert reads == ["chat"]
    slo = load_scenario("chat").slo
    assert slo.ttft is not None and slo.e2e != 3.0  # the scenario's, and an override
    assert res.spec.refs["ttft"] == slo.ttft
    assert res.spec.refs["e2e"] == 3.0
    assert res.spec.max_error_rate == 0.01


def test_study_json_holds_each_trials_plan(tmp_path: Path) -> None:
    target = FakeTarget()
    plan = plan_trials(OptimizeOptions(scenario="chat", trial_duration_s=12)).plan
    assert plan is not None
    ran = plan.as_run(1000.0, plan.measured_window(1000.0, 1012.0)[:2])
    measure = FakeMeasure(target, plan=ran)
    res = run_optimize(
        study_options(tmp_path, budget=3, confirm_runs=0), harness=harness(target, measure)
    )
    assert all(t.plan == ran for t in res.trials if t.state in ("COMPLETE", "PRUNED"))
    data = json.loads((tmp_path / "report" / "study.json").read_text())
    for t in data["trials"]:
        assert RunPlan.model_validate(t["plan"]) == ran
    # Resumed: the plans come back from the study's storage.
    more = study_options(tmp_path, budget=4, confirm_runs=0, resume=True, out_dir=tmp_path / "r2")
    again = run_optimize(more, harness=harness(target, FakeMeasure(target)))
    assert [t.plan for t in again.trials[:3]] == [t.plan for t in res.trials]
    assert again.trials[3].plan is None  # that measurement had none
