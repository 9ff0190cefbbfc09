"""A balancer that dies under a study ends the study at once, stored and resumable.

Found in a 50-trial study: HAProxy's worker segfaulted at trial 25 and the 25 trials after
it each failed in ~0.1 s ("runtime socket refused"), so the study "finished" having
measured half its budget. Fakes (tests/search/fakes.py) stand in for the target and the
measurement so that the loop's behaviour is checked in milliseconds; the real check
(:func:`lbtune.cluster.api.check_balancer` on a killed HAProxy) is in
tests/cluster/test_check_balancer.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from lbtune.errors import BalancerDown
from lbtune.search.trial import Measurement, WindowHook
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options


@dataclass
class Balancer:
    """Whether the fake balancer process is alive; it dies after ``dies_after`` runs."""

    dies_after: int
    runs: int = 0
    dead: bool = False
    asked: list[bool] = field(default_factory=list)

    def check(self) -> None:
        self.asked.append(self.dead)
        if self.dead:
            raise BalancerDown("fake: haproxy (pid 1) is no longer running (exit status 139)")


@dataclass
class DyingMeasure:
    inner: FakeMeasure
    balancer: Balancer

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        m = self.inner(label, on_window)
        self.balancer.runs += 1
        self.balancer.dead = self.balancer.runs >= self.balancer.dies_after
        return m


def _opts(tmp_path: Path, **kw: object) -> OptimizeOptions:
    return study_options(tmp_path, **{"budget": 8, "confirm_runs": 0, "apply": False, **kw})


def test_a_dead_balancer_ends_the_study_at_once_and_resume_finishes_it(tmp_path: Path) -> None:
    balancer = Balancer(dies_after=3)
    # once the balancer is dead, every apply fails (as HAProxy's runtime socket refuses)
    target = FakeTarget(fail_when=lambda p: balancer.dead)
    h = replace(
        harness(target, DyingMeasure(FakeMeasure(target), balancer)),
        check_balancer=balancer.check,
    )
    with pytest.raises(BalancerDown, match="no longer running"):
        run_optimize(_opts(tmp_path), harness=h)
    import optuna

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies.db")
    states = [t.state.name for t in study.trials]
    # three measured trials, then the one whose apply met the dead balancer: no more
    assert states == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL"]
    assert "no longer running" in study.trials[3].user_attrs["fail_reason"]
    assert balancer.asked == [True]  # asked only when something failed
    # the cluster is up again: --resume continues to the budget
    balancer.dead, balancer.dies_after = False, 10**6
    res = run_optimize(_opts(tmp_path, resume=True, study=None, out_dir=tmp_path / "r2"), harness=h)
    assert len(res.trials) == 8 and res.count("COMPLETE") + res.count("PRUNED") == 7


def test_a_failed_apply_with_a_live_balancer_only_fails_that_trial(tmp_path: Path) -> None:
    balancer = Balancer(dies_after=10**6)
    target = FakeTarget(fail_when=lambda p: p["algorithm"] == "random")
    h = replace(harness(target, FakeMeasure(target)), check_balancer=balancer.check)
    res = run_optimize(_opts(tmp_path, budget=10, sampler="random"), harness=h)
    failed = [t for t in res.trials if t.state == "FAIL"]
    assert failed and len(res.trials) == 10
    assert balancer.asked == [False] * len(failed)
