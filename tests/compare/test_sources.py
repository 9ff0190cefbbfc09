"""A study report as a side of `lbtune compare`: baseline, winner, pooled confirmation runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lbtune.compare.verdict import compare, load_pair, load_side
from lbtune.loadgen.recordio import write_parquet
from lbtune.metrics.bootstrap import RunArrays, point
from lbtune.metrics.summary import Window
from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.requests import RequestRecord
from lbtune.report.study import study_json
from lbtune.search.result import Comparison, Confirmation, StudyResult, TrialResult
from tests.metrics.records import rec

SCENARIO = """\
name: quick
description: compare tests
seed: 5
duration_s: 20
warmup_s: 4
cooldown_s: 2
slo: {ttft: 1s, e2e: 10s}
load: {type: constant, users: 4}
models: {m: 1}
prompt_tokens: {type: fixed, value: 100}
output_tokens: {type: fixed, value: 20}
"""
T0 = 1_700_000_000.0


def run_records(t0: float, scale: float) -> list[RequestRecord]:
    return [
        rec(
            i,
            sent=t0 + i * 0.1,
            ttft=(0.05 + (i % 13) * 0.01) * scale,
            e2e=(0.4 + (i % 29) * 0.02) * scale,
        )
        for i in range(200)
    ]


def write_run(d: Path, scenario: Path, t0: float, scale: float) -> list[RequestRecord]:
    """Records and the run's plan (``run.json``) as ``run_stress`` leaves them."""
    from lbtune.run.plan import plan_run
    from lbtune.run.stress import StressOptions
    from lbtune.scenario.runplan import write_run_plan

    recs = run_records(t0, scale)
    write_parquet(recs, d / "requests.parquet")
    plan = plan_run(StressOptions(scenario=str(scenario), duration_s=20.0, seed=5))
    write_run_plan(d, plan.as_run(t0, plan.window_at(t0)))
    return recs


@pytest.fixture
def study_dir(tmp_path: Path) -> Path:
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(SCENARIO)
    d = tmp_path / "study"
    fig = Figures(p99_e2e_s=1.0, p99_ttft_s=0.2, requests_per_s=9.0, goodput_per_s=9.0)
    for label, t0, scale in (
        ("trial-0000", T0, 1.0),
        ("trial-0002", T0 + 100, 0.5),
        ("confirm-1-A", T0 + 200, 1.0),
        ("confirm-1-B1", T0 + 300, 0.5),
        ("confirm-2-A", T0 + 400, 1.0),
        ("confirm-2-B1", T0 + 500, 0.5),
    ):
        (d / "runs" / label).mkdir(parents=True)
        write_run(d / "runs" / label, scenario, t0, scale)
    trials = (
        TrialResult(0, "COMPLETE", "live", {"w": 1}, 1.0, (1.0,), fig, True),
        TrialResult(1, "FAIL", "sampled", {"w": 2}, fail_reason="x"),
        TrialResult(2, "COMPLETE", "sampled", {"w": 3}, 0.5, (0.5,), fig, True),
    )
    comp = Comparison(2, {"w": 3}, (0.5, 0.5), (1.0, 1.0), -0.5, -0.6, -0.4, -0.5, True, True, fig)
    result = StudyResult(
        study="s1",
        storage="sqlite://",
        target="haproxy",
        scenario=str(scenario),
        sampler="tpe",
        spec=ObjectiveSpec(refs={"e2e": 10.0, "ttft": 1.0, "decay": 0.12}),
        budget=3,
        trials=trials,
        best=2,
        baseline=0,
        confirmation=Confirmation("improved", 0, fig, (comp,), winner=2, runs_per_arm=2),
    )
    (d / "study.json").write_text(study_json(result))
    return d


def test_a_study_alone_compares_its_baseline_with_its_winner(study_dir: Path) -> None:
    a, b = load_pair(study_dir, None)
    assert a.label == "study s1: baseline (trial 0)"
    assert b.label == "study s1: winner (trial 2, confirmed)"
    assert a.runs == b.runs == 2 and a.arrays is not None and b.arrays is not None
    assert a.slo == (1.0, 10.0)
    result = compare(a, b)
    assert result.verdict == "improvement" and not result.failed
    assert {"ttft_p99", "e2e_p99"} <= {f.key for f in result.improvements}


def test_study_run_windows_are_read_from_run_json(study_dir: Path) -> None:
    side = load_side(study_dir / "study.json", pick="baseline")
    assert side.arrays is not None
    recs = run_records(T0 + 200, 1.0)
    one = RunArrays.from_records(recs, Window(T0 + 204, T0 + 218))
    assert side.arrays.window_s == pytest.approx(2 * one.window_s)
    assert point(side.arrays)["requests_per_s"] == pytest.approx(point(one)["requests_per_s"])


def test_a_study_against_a_stress_run_uses_its_result(study_dir: Path, tmp_path: Path) -> None:
    side = load_side(study_dir)
    assert side.label.endswith("winner (trial 2, confirmed)")
    import shutil

    shutil.rmtree(study_dir / "runs")
    bare = load_side(study_dir)
    assert bare.arrays is None and bare.figures["e2e_p99"] == 1.0
    assert any("not used" in n for n in bare.notes)


def test_a_rolled_back_winner_is_not_the_result(study_dir: Path) -> None:
    data = json.loads((study_dir / "study.json").read_text())
    data["rollout"] = {"applied": True, "via": "ansible", "verified": False, "rolled_back": True}
    (study_dir / "study.json").write_text(json.dumps(data))
    side = load_side(study_dir)
    assert side.label == "study s1: baseline (trial 0), no confirmed winner"
    assert any("rolled back" in n for n in side.notes)
    assert load_pair(study_dir, None)[1].label.endswith("winner (trial 2, confirmed)")


def test_a_study_pair_uses_only_the_rounds_both_arms_ran(study_dir: Path) -> None:
    """The winner was measured in round 2 only: the baseline side is round 2's run and the
    comparison's own baseline figures, not the baseline pooled over every round."""
    data = json.loads((study_dir / "study.json").read_text())
    (comparison,) = data["confirmation"]["comparisons"]
    comparison["rounds"] = [2]
    comparison["baseline_figures"] = {**data["confirmation"]["baseline_figures"], "p99_e2e_s": 7.0}
    (study_dir / "study.json").write_text(json.dumps(data))
    a, b = load_pair(study_dir, None)
    assert a.runs == b.runs == 1
    assert a.figures["e2e_p99"] == 7.0
    assert a.arrays is not None
    one = RunArrays.from_records(run_records(T0 + 400, 1.0), Window(T0 + 404, T0 + 418))
    assert a.arrays.window_s == pytest.approx(one.window_s)


def test_the_study_report_names_the_traffic_its_trials_replayed(study_dir: Path) -> None:
    """The study report's traffic line comes from the trials' recorded plans (for a trace:
    file, format, window and speed), not from the scenario file."""
    from lbtune.report.study import render_markdown, traffic
    from lbtune.search.result import StudyResult

    data = json.loads((study_dir / "study.json").read_text())
    result = StudyResult(
        study="s1",
        storage="sqlite://",
        target="haproxy",
        scenario=data["scenario"],
        sampler="tpe",
        spec=ObjectiveSpec(refs={"e2e": 10.0, "ttft": 1.0, "decay": 0.12}),
        budget=3,
        trials=(),
        best=None,
        baseline=None,
        report_dir=str(study_dir),
    )
    assert traffic(result) == "quick"
    assert "Traffic: quick." in render_markdown(result)
