"""Defect 4 of issue 16: ``optimize --budget 6``, killed after two trials, then ``--resume``
without ``--budget`` ran to 50 trials. A resumed study keeps its own budget (an explicit
``--budget`` still overrides it).

Fake target and measurement (the study loop, storage and resume are real); the kill -9 of a
real ``optimize`` mid-trial is ``tests/tune/test_optimize_e2e.py`` and ``test_faults.py``.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from lbtune.search.study import owner
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeMeasure, FakeTarget, harness


def _opts(tmp_path: Path, **kw: object) -> OptimizeOptions:
    base: dict[str, object] = {
        "study": "s",
        "storage": f"sqlite:///{tmp_path}/studies.db",
        "reports_root": tmp_path / "reports",
        "out_dir": tmp_path / "report",
        "seed": 1,
        "confirm_runs": 0,
    }
    return OptimizeOptions(**{**base, **kw})  # type: ignore[arg-type]


def _killed_after_two(tmp_path: Path, target: FakeTarget) -> None:
    """A study of budget 6 whose process died in its third trial."""
    measure = FakeMeasure(target)
    stop_after = 2

    class Stop(Exception):
        pass

    def on_progress(p: object) -> None:
        if getattr(p, "done", 0) >= stop_after:
            raise Stop

    with pytest.raises(Stop):
        run_optimize(
            _opts(tmp_path, budget=6), harness=harness(target, measure), on_progress=on_progress
        )
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies.db")
    t = study.ask()  # the trial the dead process was running
    t.set_user_attr("owner", owner().rsplit(":", 1)[0] + ":999999999")


@pytest.mark.parametrize(("given", "total"), [(None, 6), (4, 4)], ids=["stored", "explicit"])
def test_resume_runs_to_the_studys_budget(tmp_path: Path, given: int | None, total: int) -> None:
    target = FakeTarget()
    _killed_after_two(tmp_path, target)
    res = run_optimize(
        _opts(tmp_path, budget=given, resume=True, out_dir=tmp_path / "r2"),
        harness=harness(target, FakeMeasure(target)),
    )
    assert res.budget == total
    assert len(res.trials) == total
    assert sum(1 for t in res.trials if t.fail_reason == "interrupted: process died") == 1
