"""The run plan recorded once (``run.json``): planned purely, written and read back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from lbtune.runplan import RUN_PLAN_FILE, RunPlan, plan_run, read_run_plan, write_run_plan
from lbtune.scenario import builtin_names, load_scenario, plan_load
from lbtune.stress import StressOptions


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_plan_round_trips_through_run_json(name: str, tmp_path: Path) -> None:
    plan = plan_run(StressOptions(scenario=name, duration_s=30, seed=7))
    write_run_plan(tmp_path, plan)
    back = read_run_plan(tmp_path)
    assert back == plan
    assert back.scenario == load_scenario(name)
    # The concrete load plan comes from the recorded document alone, identically.
    assert back.load_plan() == plan_load(load_scenario(name), 30, None, None, 7)


def test_the_plan_records_window_seed_load_slo_and_version(tmp_path: Path) -> None:
    plan = plan_run(StressOptions(scenario="chat", duration_s=30, users=4, slo="ttft=200ms"))
    sc = load_scenario("chat")
    lp = plan_load(sc, 30, 4, None, None)
    assert (plan.window_start_s, plan.window_end_s) == lp.measure_window
    assert plan.seed == sc.seed
    assert plan.load.mode == "closed" and plan.load.users == 4 and plan.load.duration_s == 30
    assert [s.users for s in plan.load.stages] == [s.users for s in lp.stages]
    assert plan.slo.ttft_s == pytest.approx(0.2)
    assert plan.slo.e2e_s == sc.slo.e2e
    import lbtune

    assert plan.lbtune_version == lbtune.__version__
    assert plan.started_at is None and plan.window_start is None
    ran = plan.as_run(1000.0, plan.window_at(1000.0))
    assert (ran.window_start, ran.window_end) == (
        1000.0 + lp.measure_window[0],
        1000.0 + lp.measure_window[1],
    )
    path = write_run_plan(tmp_path, ran)
    assert path.name == RUN_PLAN_FILE
    assert read_run_plan(path) == ran


def test_a_given_plan_is_run_as_is() -> None:
    plan = plan_run(StressOptions(scenario="chat", duration_s=30))
    assert plan_run(StressOptions(scenario="longctx", duration_s=5, plan=plan)) is plan


def test_until_samples_holds_the_last_stage_up_to_the_bound() -> None:
    plan = plan_run(
        StressOptions(scenario="chat", duration_s=20, until_samples=100, max_duration_s=90)
    )
    ld = plan.load
    assert ld.until_samples == 100 and ld.duration_s == 90 and ld.shape_duration_s == 20
    assert ld.stages[-1].label == "hold" and ld.stages[-1].end_s == 90
    assert ld.stages[-1].users == ld.stages[-2].users
    assert plan.window_end_s == 90 - ld.cooldown_s
    assert plan.load_plan().users_at(80) == ld.stages[-2].users


def test_max_duration_without_until_samples_is_refused() -> None:
    with pytest.raises(ConfigError, match="--max-duration"):
        plan_run(StressOptions(scenario="chat", max_duration_s=60))


def test_a_run_directory_without_run_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no run\.json .*re-run"):
        read_run_plan(tmp_path)
    (tmp_path / RUN_PLAN_FILE).write_text('{"schema_version": 1}')
    with pytest.raises(ConfigError, match="not a valid run plan"):
        read_run_plan(tmp_path)


def test_the_plan_rejects_unknown_fields() -> None:
    plan = plan_run(StressOptions(scenario="chat"))
    data = plan.model_dump(by_alias=True)
    data["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        RunPlan.model_validate(data)
