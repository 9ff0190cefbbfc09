"""A run runs its recorded plan, whole, and ``--until-samples`` gathers enough requests.

On a real mini2 cluster (sim + HAProxy + Prometheus + Locust), time-scaled so that it
takes seconds. The scenario file is deleted once the run is planned: the generator
processes and the report can only have the plan that ``run.json`` recorded. Editing the
file afterwards changes nothing about the finished run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lbtune.loadgen.collect import Progress
from lbtune.loadgen.recordio import read_records
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions, StressResult, run_stress
from lbtune.scenario.runplan import read_run_plan
from tests.conftest import running_cluster

pytestmark = pytest.mark.integration

SCENARIO = """\
name: until-test
seed: 3
duration_s: 3
warmup_s: 1
cooldown_s: 0.5
load: {type: constant, users: 4}
models: {llama-3.1-8b-instruct: 1}
prompt_tokens: {type: fixed, value: 32}
output_tokens: {type: fixed, value: 16}
stream: true
"""
NEED = 100
SNAPSHOTS: list[Progress] = []
"""The run's live snapshots (what ``--until-samples`` saw)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("until-cluster"), time_scale=8.0) as ep:
        yield ep


@pytest.fixture(scope="module")
def run(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StressResult, Path, Path]]:
    """Plan from a scenario file, delete the file, then run the plan until NEED samples."""
    base = tmp_path_factory.mktemp("until-run")
    scenario = base / "until-test.yaml"
    scenario.write_text(SCENARIO)
    out = base / "report"
    mp = pytest.MonkeyPatch()
    mp.setenv("LBTUNE_HISTORY_DB", str(base / "history.db"))
    try:
        plan = plan_run(
            StressOptions(scenario=str(scenario), until_samples=NEED, max_duration_s=60)
        )
        scenario.unlink()  # nothing may read it from here on
        result = run_stress(
            StressOptions(plan=plan, state_dir=Path(cluster.state_dir), out_dir=out),
            on_progress=SNAPSHOTS.append,
        )
        yield result, out, scenario
    finally:
        mp.undo()


def _ok_in_window(result: StressResult) -> int:
    w = result.summary.window
    return sum(
        1 for r in read_records(result.records_path) if r.outcome == "ok" and w.contains(r.sent_at)
    )


def test_run_json_holds_the_plan_as_run(run: tuple[StressResult, Path, Path]) -> None:
    result, out, _ = run
    recorded = read_run_plan(out)
    assert recorded == result.plan
    assert recorded.scenario_name == "until-test" and recorded.seed == 3
    assert recorded.started_at == result.summary.run_start
    assert (recorded.window_start, recorded.window_end) == (
        result.summary.window.start,
        result.summary.window.end,
    )
    assert recorded.target.url == result.target.url
    assert recorded.target.name == "haproxy"
    assert recorded.target.params  # the balancer config live during the run


def test_the_generators_ran_the_recorded_plan(run: tuple[StressResult, Path, Path]) -> None:
    result, out, _ = run
    cfg = json.loads((out / "load-config.json").read_text())
    assert cfg["run_plan"] == str((out / "run.json").resolve())
    records = read_records(result.records_path)
    assert records and all(r.model == "llama-3.1-8b-instruct" for r in records)
    assert {r.prompt_tokens for r in records if r.outcome == "ok"} <= {32, None} or all(
        r.output_tokens == 16 for r in records if r.outcome == "ok"
    )


def test_until_samples_stops_once_the_window_holds_enough(
    run: tuple[StressResult, Path, Path],
) -> None:
    result, _, _ = run
    assert not result.load.stopped_early  # stopping on enough samples is not an interruption
    assert _ok_in_window(result) >= NEED
    assert any(n.startswith(f"--until-samples {NEED}: reached") for n in result.summary.notes)
    planned_end = result.plan.started_at + result.plan.window_end_s  # type: ignore[operator]
    assert result.summary.window.end < planned_end  # it did not run to the 60 s bound
    assert result.summary.latency.e2e.p99 is not None


def test_editing_the_scenario_afterwards_changes_nothing(
    run: tuple[StressResult, Path, Path],
) -> None:
    from lbtune.compare.verdict import load_side
    from lbtune.history.index import recorded_window

    result, out, scenario = run
    summary_before = (out / "summary.json").read_text()
    side_before = load_side(out)
    scenario.write_text(
        SCENARIO.replace("warmup_s: 1", "warmup_s: 2.5").replace("seed: 3", "seed: 9")
    )
    assert read_run_plan(out) == result.plan
    assert (out / "summary.json").read_text() == summary_before
    side = load_side(out)
    assert side.figures == side_before.figures
    assert side.arrays is not None and side_before.arrays is not None
    assert side.arrays.window_s == side_before.arrays.window_s
    w = result.summary.window
    got = recorded_window(out)
    assert got == pytest.approx(
        (w.start - result.summary.run_start, w.end - result.summary.run_start)
    )


def test_the_live_window_is_the_recorded_one(run: tuple[StressResult, Path, Path]) -> None:
    """``--until-samples`` counted over the window the summary and ``run.json`` report:
    the plan's, anchored on the start the runner knew (the generators')."""
    result, out, _ = run
    last = SNAPSHOTS[-1]
    assert last.started_at == result.load.started_at == read_run_plan(out).started_at
    start, _end = result.plan.window_at(last.started_at)
    assert result.summary.window.start == start == read_run_plan(out).window_start
    # The one tail handed every record on, once.
    handed = [r.request_id for p in SNAPSHOTS for r in p.records]
    assert len(handed) == len(set(handed)) > NEED
