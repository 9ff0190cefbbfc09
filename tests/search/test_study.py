"""The study loop end to end with a fake target and a fake measurement (fast, pure)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import optuna
import pytest

from lbtune.search.study import owner
from lbtune.tune.optimize import run_optimize
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options

_opts = study_options


def test_references_first_then_sampled_and_report(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 0.9}  # the user's live config differs from round robin
    res = run_optimize(_opts(tmp_path), harness=harness(target, FakeMeasure(target)))
    roles = [t.role for t in res.trials]
    assert roles[:3] == ["live", "round-robin", "least-conn"]
    assert res.trials[0].params["x"] == 0.9
    assert res.trials[1].params["algorithm"] == "roundrobin"
    assert res.trials[2].params["algorithm"] == "leastconn"
    assert set(roles[3:]) == {"sampled"}
    assert len(res.trials) == 6 and res.baseline == 0
    data = json.loads((tmp_path / "report" / "study.json").read_text())
    assert data["baseline_trial"] == 0 and len(data["trials"]) == 6
    assert (tmp_path / "report" / "report.html").read_text().count("data:image/png;base64") >= 3
    assert "Before / after" in (tmp_path / "report" / "report.md").read_text()


def test_identical_references_enqueued_once(tmp_path: Path) -> None:
    target = FakeTarget()  # live == round robin baseline
    res = run_optimize(_opts(tmp_path, budget=3), harness=harness(target, FakeMeasure(target)))
    assert [t.role for t in res.trials] == ["live", "least-conn", "sampled"]


def test_failed_trial_recorded_and_study_continues(tmp_path: Path) -> None:
    target = FakeTarget(fail_when=lambda p: p["algorithm"] == "random")
    res = run_optimize(
        _opts(tmp_path, budget=10, sampler="random"), harness=harness(target, FakeMeasure(target))
    )
    failed = [t for t in res.trials if t.state == "FAIL"]
    assert failed, "the random sampler should have picked algorithm=random at least once"
    assert all("apply failed" in (t.fail_reason or "") for t in failed)
    assert len(res.trials) == 10
    assert res.count("COMPLETE") + res.count("PRUNED") == 10 - len(failed)


def _rerun_attr(tmp_path: Path, number: int) -> object:
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies.db")
    return study.trials[number].user_attrs.get("rerun")


def test_degraded_measurement_is_rerun_once_in_the_same_trial(tmp_path: Path) -> None:
    target = FakeTarget()
    measure = FakeMeasure(target, degraded_once={"trial-0001"})
    said: list[str] = []
    res = run_optimize(_opts(tmp_path, budget=5), harness=harness(target, measure), say=said.append)
    t1 = res.trials[1]
    assert t1.state == "COMPLETE" and len(res.trials) == 5  # no extra trial, no FAIL
    assert "trial-0001-rerun" in measure.calls
    assert "fell behind" in str(_rerun_attr(tmp_path, 1))
    lines = [m for m in said if m.startswith("trial 1:")]
    assert len(lines) == 1 and "re-running it once" in lines[0] and "lateness" in lines[0]


def test_degraded_twice_fails_the_trial(tmp_path: Path) -> None:
    target = FakeTarget()
    measure = FakeMeasure(target, degraded_once={"trial-0001", "trial-0001-rerun"})
    res = run_optimize(_opts(tmp_path, budget=4, confirm_runs=0), harness=harness(target, measure))
    assert res.trials[1].state == "FAIL" and "fell behind" in (res.trials[1].fail_reason or "")
    assert len(res.trials) == 4


def test_failed_baseline_is_retried_before_the_study_goes_on(tmp_path: Path) -> None:
    target = FakeTarget()
    measure = FakeMeasure(target, fail_once={"trial-0000"})
    said: list[str] = []
    res = run_optimize(_opts(tmp_path, budget=4), harness=harness(target, measure), say=said.append)
    assert measure.calls[:3] == ["trial-0000", "trial-0000-rerun", "trial-0001"]
    assert res.trials[0].state == "COMPLETE" and res.trials[0].role == "live"
    assert res.baseline == 0
    lines = [m for m in said if m.startswith("trial 0:")]
    assert len(lines) == 1 and "baseline failed" in lines[0] and "not measurable" in lines[0]


def test_a_failed_sampled_trial_is_not_retried(tmp_path: Path) -> None:
    target = FakeTarget()
    measure = FakeMeasure(target, fail_once={"trial-0002"})
    res = run_optimize(_opts(tmp_path, budget=4, confirm_runs=0), harness=harness(target, measure))
    assert res.trials[2].state == "FAIL" and "trial-0002-rerun" not in measure.calls


def test_pruning_stops_bad_trials(tmp_path: Path) -> None:
    target = FakeTarget()
    res = run_optimize(
        _opts(tmp_path, budget=16, sampler="random", confirm_runs=0),
        harness=harness(target, FakeMeasure(target)),
    )
    pruned = [t for t in res.trials if t.state == "PRUNED"]
    assert pruned
    best = res.trial(res.best)
    assert best is not None and best.objective is not None
    for t in pruned:  # a pruned trial was worse than the median at the window it stopped
        step = max(t.intermediate)
        assert t.intermediate[step] > best.objective


def test_resume_after_crash_marks_running_trial_failed(tmp_path: Path) -> None:
    target = FakeTarget()
    h = harness(target, FakeMeasure(target))
    storage = f"sqlite:///{tmp_path}/studies.db"
    run_optimize(_opts(tmp_path, budget=3, confirm_runs=0), harness=h)
    # Simulate `kill -9` in the middle of trial 3: a RUNNING trial owned by a dead process.
    study = optuna.load_study(study_name="s", storage=storage)
    t = study.ask()
    t.set_user_attr("owner", owner().rsplit(":", 1)[0] + ":999999999")
    target.live = {**target.live, "x": 0.99}  # the crash left a trial's config live
    n0 = len(target.applied)
    res = run_optimize(
        _opts(tmp_path, budget=6, resume=True, study=None, out_dir=tmp_path / "r2"), harness=h
    )
    crashed = res.trial(3)
    assert crashed is not None and crashed.state == "FAIL"
    assert crashed.fail_reason == "interrupted: process died"
    assert len(res.trials) == 6 and res.study == "s"
    # The first thing the resume did was put the last known good back.
    assert target.applied[n0] == target.space().baseline()


def test_resume_requires_existing_study(tmp_path: Path) -> None:
    from lbtune.errors import ConfigError

    target = FakeTarget()
    with pytest.raises(ConfigError, match="no study"):
        run_optimize(_opts(tmp_path, resume=True), harness=harness(target, FakeMeasure(target)))


def test_ctrl_c_stops_trial_restores_lkg(tmp_path: Path) -> None:
    target = FakeTarget()
    stop = threading.Event()
    measure = FakeMeasure(target, interrupt_on="trial-0003", stop=stop)
    res = run_optimize(_opts(tmp_path), harness=harness(target, measure), stop=stop)
    assert res.interrupted
    t3 = res.trial(3)
    assert t3 is not None and t3.state == "FAIL" and "interrupted" in (t3.fail_reason or "")
    assert len(res.trials) == 4 and res.confirmation is None
    assert target.live == target.lkg
    assert (tmp_path / "report" / "study.json").exists()
