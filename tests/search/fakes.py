"""A fake target and a fake measurement for fast, deterministic study tests.

Why fakes: the study loop, pruning, confirmation and rollout logic must be tested in
milliseconds and without a cluster; the real target and ``run_stress`` are covered by
``tests/tune/test_optimize_e2e.py``. The fake target implements the
:class:`lbtune.targets.targetbase.TargetBase` contract (space, read_live, apply, rollback) over a
real :class:`~lbtune.targets.space.ParameterSpace`, so validation is the real one.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from lbtune.errors import ApplyError, TrialFailed
from lbtune.objective import Figures, ObjectiveSpec, stretch_at, stretches
from lbtune.records.quantiles import percentile
from lbtune.scenario.runplan import RunPlan
from lbtune.search.harness import Harness
from lbtune.search.trial import Measure, Measurement, Samples, WindowHook
from lbtune.targets.base import ApplyResult, ParamSet
from lbtune.targets.space import ParameterSpace, SpaceFile
from lbtune.targets.targetbase import TargetBase
from lbtune.tune.options import OptimizeOptions

SPACE = {
    "target": "fake",
    "params": {
        "algorithm": {
            "type": "categorical",
            "choices": ["roundrobin", "leastconn", "random"],
            "baseline": "roundrobin",
            "references": {"least-conn": "leastconn"},
        },
        "weight": {"type": "int", "low": 1, "high": 256, "baseline": 100, "per_server": True},
        "x": {"type": "float", "low": 0.0, "high": 1.0, "baseline": 0.5},
    },
}


class FakeTarget(TargetBase):
    name = "fake"
    state_dir = Path("/nonexistent/fake-target")

    def __init__(self, fail_when: Callable[[ParamSet], bool] | None = None) -> None:
        self.fake_space = ParameterSpace.from_file(SpaceFile.model_validate(SPACE), ["a", "b"])
        self.live: ParamSet = self.fake_space.baseline()
        self.lkg: ParamSet = dict(self.live)
        self.applied: list[ParamSet] = []
        self.fail_when = fail_when

    def replica_names(self) -> list[str]:
        return ["a", "b"]

    def space(self) -> ParameterSpace:
        return self.fake_space

    def read_live(self) -> ParamSet:
        return dict(self.live)

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        checked = self.validate(params)
        if self.fail_when is not None and self.fail_when(checked):
            raise ApplyError("fake balancer refused the config")
        self.live = self.fake_space.complete(checked, self.live)
        self.applied.append(dict(self.live))
        return ApplyResult(changed=True, applied=dict(self.live))

    def rollback(self, *, check: bool = False) -> ApplyResult:
        return self.apply(self.lkg)


def quality(p: ParamSet) -> float:
    """Latency multiplier of a parameter set: best at x=0.2 with leastconn."""
    x = float(p["x"])
    algo = {"roundrobin": 0.4, "leastconn": 0.0, "random": 0.2}[str(p["algorithm"])]
    return 1.0 + 4.0 * (x - 0.2) ** 2 + algo


@dataclass
class FakeMeasure:
    """Samples latencies from a distribution scaled by :func:`quality` of what is live."""

    target: FakeTarget
    quality: Callable[[ParamSet], float] = quality
    n: int = 400
    windows: int = 3
    degraded_once: set[str] = field(default_factory=set)
    fail_once: set[str] = field(default_factory=set)
    """Labels whose first measurement fails (not measurable)."""
    interrupt_on: str | None = None
    stop: threading.Event | None = None
    calls: list[str] = field(default_factory=list)
    plan: RunPlan | None = None
    """The run plan each measurement says it ran (a real one runs ``run.json``'s)."""
    spec: ObjectiveSpec | None = None
    """Under the capacity objective, the figures carry the SLO stretch and attainment
    (as the real measurement's do, from the same functions)."""

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        self.calls.append(label)
        if label in self.fail_once:
            self.fail_once.discard(label)
            raise TrialFailed("not measurable: the fake measurement failed")
        q = self.quality(self.target.live)
        seed = int(hashlib.sha256(label.encode()).hexdigest()[:8], 16)
        rng = np.random.default_rng(seed)
        e2e = q * rng.lognormal(0.0, 0.3, self.n)
        ttft = q * 0.1 * rng.lognormal(0.0, 0.3, self.n)
        stopped = False
        for step in range(1, self.windows + 1):
            k = self.n * step // self.windows
            fig = Figures(percentile(list(e2e[:k]), 99), percentile(list(ttft[:k]), 99))
            if on_window is not None and on_window(step, fig):
                stopped = True
                break
            if self.interrupt_on == label and self.stop is not None:
                self.stop.set()
                stopped = True
                break
        degraded = ("lateness",) if label in self.degraded_once else ()
        self.degraded_once.discard(label)
        figs = Figures(
            p99_e2e_s=percentile(list(e2e), 99),
            p99_ttft_s=percentile(list(ttft), 99),
            requests_per_s=10.0 / q,
            completed=self.n,
        )
        samples = Samples.of(ttft, e2e, self.n, 0)
        if self.spec is not None and self.spec.slo is not None:
            each = stretches(ttft, [], e2e, 0, self.spec.slo)
            figs = replace(
                figs,
                slo_stretch=stretch_at(each, self.spec.share),
                attainment=float(np.mean(each <= 1.0)),
            )
        return Measurement(figs, samples, degraded, stopped, plan=self.plan)


def harness(target: FakeTarget, measure: Measure) -> Harness:
    lkg: dict[str, ParamSet] = {}

    def record(p: ParamSet, source: str) -> None:
        lkg["current"] = dict(p)
        target.lkg = dict(p)

    return Harness(
        target=target,
        measure=measure,
        rollout_apply=lambda p, source: target.apply(p),
        lkg_get=lambda: lkg.get("current"),
        lkg_record=record,
        rollout_via="direct (fake)",
    )


def study_options(tmp_path: Path, **kw: object) -> OptimizeOptions:
    """Options of a small study over the fakes: SQLite and reports under ``tmp_path``."""
    base: dict[str, object] = dict(
        budget=6,
        study="s",
        storage=f"sqlite:///{tmp_path}/studies.db",
        reports_root=tmp_path / "reports",
        out_dir=tmp_path / "report",
        seed=1,
        confirm_runs=2,
    )
    base.update(kw)
    return OptimizeOptions(**base)  # type: ignore[arg-type]
