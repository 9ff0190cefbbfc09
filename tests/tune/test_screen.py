"""Screening in the twin (:mod:`lbtune.tune.screen`): the picks, the study it feeds (the
screened configs go live first, each live trial beside the twin's prediction, in the
report), determinism, and the fallback to a live-only search."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lbtune.cluster.config import load_config
from lbtune.cluster.twin import space_path, twin_cluster
from lbtune.objective import Figures
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario import load_scenario
from lbtune.search.result import TrialResult
from lbtune.targets.params import ParamSet
from lbtune.targets.space import ParameterSpace
from lbtune.tune import screen as screen_mod
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import objective_spec
from lbtune.tune.screen import (
    Screener,
    ScreenRequest,
    live_picks,
    pick_diverse,
    spearman,
    start_screen,
)
from lbtune.tune.virtual import Predicted, VirtualBench
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options

CLUSTER = "mini2"


def _state(tmp_path: Path) -> Path:
    """A state directory with ``mini2``'s recorded config, as ``cluster up`` leaves it."""
    d = tmp_path / "state"
    d.mkdir()
    cfg = load_config(CLUSTER)[0]
    (d / "config.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    return d


def _space() -> ParameterSpace:
    names = [r.name for r in twin_cluster(CLUSTER).replicas]
    return ParameterSpace.load(space_path("haproxy"), names)


def _trials(seconds: float = 4.0) -> StressOptions:
    so = StressOptions(scenario="chat", duration_s=seconds)
    return replace(so, plan=plan_run(so))


def _spec(so: StressOptions) -> object:
    assert so.plan is not None
    return objective_spec("composite", so.plan.slo_value(), None)


def _pred(algorithm: str, score: float | None, x: int = 0) -> Predicted:
    fig = None if score is None else Figures(1.0, 0.1, requests_per_s=5.0, completed=100)
    return Predicted({"algorithm": algorithm, "x": x}, fig, score)


def test_picks_are_feasible_new_and_the_best_of_each_algorithm_first() -> None:
    so = _trials()
    spec = objective_spec("composite", so.plan.slo_value(), None)  # type: ignore[union-attr]
    ranked = [
        _pred("leastconn", 0.1, 1),
        _pred("leastconn", 0.2, 2),
        _pred("leastconn", 0.21, 3),
        _pred("random", 0.22),
        _pred("hash", None),
        _pred("roundrobin", 0.24),
    ]
    known: list[ParamSet] = [{"algorithm": "leastconn", "x": 1}]
    picked = pick_diverse(ranked, spec, known, 3)
    assert [(p.params["algorithm"], p.score) for p in picked] == [
        ("leastconn", 0.2),
        ("random", 0.22),
        ("roundrobin", 0.24),
    ]
    picked = pick_diverse(ranked[:4], spec, known, 3)  # fewer algorithms: the next best
    assert [p.score for p in picked] == [0.2, 0.21, 0.22]
    assert pick_diverse(ranked, spec, known, 0) == []


def test_an_algorithm_the_twin_puts_far_behind_does_not_jump_the_queue() -> None:
    so = _trials()
    spec = objective_spec("composite", so.plan.slo_value(), None)  # type: ignore[union-attr]
    ranked = [
        _pred("leastconn", 0.40, 1),
        _pred("leastconn", 0.42, 2),
        _pred("random", 0.48),  # within 1.25x of the best: its algorithm's head goes live
        _pred("leastconn", 0.49, 3),
        _pred("hash", 0.70),  # 1.75x the best: only after every closer config
        _pred("roundrobin", 0.95),
    ]
    picked = pick_diverse(ranked, spec, [], 4)
    assert [(p.params["algorithm"], p.score) for p in picked] == [
        ("leastconn", 0.40),
        ("leastconn", 0.42),
        ("random", 0.48),
        ("leastconn", 0.49),
    ]


def test_most_of_a_small_live_budget_goes_to_the_twins_picks() -> None:
    # budget 10 less two references: five screened, three of Optuna's own
    assert [live_picks(r) for r in (-1, 0, 2, 3, 6, 8, 48)] == [0, 0, 2, 3, 4, 5, 29]


def test_spearman() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [1]) is None


class _AskedBench:
    """Stands in for the twin: this test is about which configs the screen asks for, not
    what the twin makes of them (every config scores 1.0)."""

    workers = 1

    def __init__(self, asked: list[ParamSet]) -> None:
        self.asked = asked

    def __enter__(self) -> _AskedBench:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, configs: list[ParamSet]) -> list[Predicted]:
        self.asked += configs
        fig = Figures(1.0, 0.1, requests_per_s=5.0, completed=100)
        return [Predicted(dict(p), fig, 1.0) for p in configs]


class _AskedScreener(Screener):
    def __init__(self, spec: object) -> None:
        super().__init__(None, None, spec)  # type: ignore[arg-type]
        self.asked: list[ParamSet] = []

    def bench(self, plan: object = None) -> VirtualBench:
        return _AskedBench(self.asked)  # type: ignore[return-value]

    def twin_params(self, params: ParamSet) -> ParamSet:
        return params


def test_the_screen_starts_with_every_structural_choice_at_its_defaults() -> None:
    """Each algorithm and each mode of the llm scheduler at its defaults comes first (TPE
    alone left llm's predict mode unseen in a 100-config screen); a screen too small for
    them is Optuna's alone."""
    space, so = _space(), _trials(2.0)
    defaults = space.choice_defaults()
    shown = {(p["algorithm"], p["llm.mode"], p["llm.picker"], p["llm.admission"]) for p in defaults}
    assert {a for a, *_ in shown} == {"roundrobin", "leastconn", "random", "hash", "llm"}
    assert ("llm", "predict", "max", "route") in shown and len(shown) == len(defaults) == 9
    for p in defaults:  # untuned but for the choice and what makes it act
        assert {k for k, v in p.items() if v != space.baseline()[k]} <= {
            "algorithm",
            "llm.mode",
            "llm.picker",
            "llm.admission",
        }
    sc = _AskedScreener(_spec(so))
    ranked = screen_mod._search(sc, space, 4 * len(defaults), seed=3)
    assert sc.asked[: len(defaults)] == defaults and len(ranked) == 4 * len(defaults)
    small = _AskedScreener(_spec(so))
    screen_mod._search(small, space, 4 * len(defaults) - 1, seed=3)
    assert small.asked[: len(defaults)] != defaults


def test_screening_is_deterministic_and_off_without_a_twin(tmp_path: Path) -> None:
    # Four configs of 2 s trials (8 virtual s each): determinism needs no more, and each
    # virtual second of chat on mini2 costs CPU the rest of the suite shares.
    so, space = _trials(2.0), _space()
    spec = objective_spec("composite", so.plan.slo_value(), None)  # type: ignore[union-attr]
    said: list[str] = []
    req = ScreenRequest(4, _state(tmp_path), so, seed=3)
    first, note = start_screen(req, space, [space.baseline()], spec, said.append)
    again, _ = start_screen(req, space, [space.baseline()], spec, said.append)
    assert note is None and first is not None and again is not None
    assert first.screened == 4 and 1 <= len(first.picked) <= live_picks(req.live_room)
    assert first.plan.load.duration_s == pytest.approx(2.0 * screen_mod.WINDOW_FACTOR)
    assert [p.params for p in first.picked] == [p.params for p in again.picked]
    assert [p.score for p in first.picked] == [p.score for p in again.picked]
    assert all(p.params != space.baseline() for p in first.picked)
    assert start_screen(replace(req, n=0), space, [], spec, said.append) == (None, None)
    assert start_screen(replace(req, state_dir=None), space, [], spec, said.append) == (None, None)
    empty = tmp_path / "empty"
    empty.mkdir()
    off, note = start_screen(replace(req, state_dir=empty), space, [], spec, said.append)
    assert off is None and note is not None
    assert note.startswith("no screening:") and note.endswith("the search is live-only")


def test_agent_sessions_are_not_screened_and_the_study_says_why(tmp_path: Path) -> None:
    so, space = _trials(), _space()
    assert so.plan is not None
    agent = replace(so, plan=so.plan.model_copy(update={"scenario": load_scenario("agent")}))
    spec = objective_spec("composite", so.plan.slo_value(), None)
    said: list[str] = []
    req = ScreenRequest(6, _state(tmp_path), agent, seed=3)
    off, note = start_screen(req, space, [], spec, said.append)
    assert off is None and said == [note]
    assert note == (
        "no screening: scenario 'agent' has agent sessions: the twin cannot screen them yet; "
        "run optimize with --screen 0; the search is live-only"
    )


def test_a_twin_failure_falls_back_to_live_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: object, batch: object, seed: int = 0) -> list[Predicted]:
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(VirtualBench, "run", broken)
    so, space = _trials(), _space()
    spec = objective_spec("composite", so.plan.slo_value(), None)  # type: ignore[union-attr]
    said: list[str] = []
    sc, note = start_screen(ScreenRequest(4, _state(tmp_path), so), space, [], spec, said.append)
    assert sc is None
    assert note == "screening failed (engine exploded); the search is live-only"
    assert said[-1] == note


def test_live_trials_beside_the_twin(tmp_path: Path) -> None:
    so, space = _trials(), _space()
    spec = objective_spec("composite", so.plan.slo_value(), None)  # type: ignore[union-attr]
    assert so.plan is not None
    long = plan_run(replace(so, duration_s=12.0, plan=None))
    sc = Screener(twin_cluster(CLUSTER), long, spec, so.plan)
    configs = [{**space.baseline(), "algorithm": a} for a in ("roundrobin", "leastconn", "random")]
    with sc.bench(so.plan) as bench:  # the live trials' plan, as they were measured
        twin = bench.run([sc.twin_params(c) for c in configs])
    trials = [
        TrialResult(i, "COMPLETE", "sampled", c, p.score, figures=p.figures)
        for i, (c, p) in enumerate(zip(configs, twin, strict=True))
    ]
    trials.append(TrialResult(3, "FAIL", "sampled", configs[0]))
    said: list[str] = []
    out = sc.compare(trials, said.append)
    assert [r.trial for r in out.rows] == [0, 1, 2]  # the failed trial has no row
    assert all(r.predicted == r.measured for r in out.rows)  # same plan: same figures
    assert (out.window_s, out.live_window_s) == (12.0, 4.0)
    assert out.rank_corr == pytest.approx(1.0)
    assert any("rank agreement" in line for line in said)


class HaproxyFake(FakeTarget):
    name = "haproxy"


def _haproxy_target() -> FakeTarget:
    """The fake target over HAProxy's real space on mini2's replicas."""
    target = HaproxyFake()
    target.fake_space = _space()
    target.live = target.fake_space.baseline()
    target.lkg = dict(target.live)
    return target


def _quality(p: ParamSet) -> float:
    return {"leastconn": 1.0, "llm": 1.1}.get(str(p["algorithm"]), 1.5)


def test_the_study_sends_the_screened_configs_live_and_reports_the_twin(tmp_path: Path) -> None:
    target = _haproxy_target()
    h = harness(target, FakeMeasure(target, quality=_quality))
    h.state_dir = _state(tmp_path)
    opts = study_options(
        tmp_path, budget=6, screen=6, scenario="chat", trial_duration_s=2.0, confirm_runs=1
    )  # 2 s trials: the twin runs each screened and each live config for 8 virtual s
    res = run_optimize(opts, harness=h)
    roles = [t.role for t in res.trials]
    assert roles[:2] == ["live", "least-conn"]
    assert "screened" in roles[2:5] and roles.index("screened") == 2
    s = res.screening
    assert s is not None and s.screened == 6 and s.sent_live == roles.count("screened")
    assert {r.trial for r in s.rows} == {t.number for t in res.trials if t.state == "COMPLETE"}
    data = json.loads((tmp_path / "report" / "study.json").read_text())
    assert data["screening"]["screened"] == 6
    assert "## Screening in the twin" in (tmp_path / "report" / "report.md").read_text()


def test_a_study_without_a_twin_says_so_and_runs_live(tmp_path: Path) -> None:
    target = FakeTarget()  # not the balancer the cluster runs
    h = harness(target, FakeMeasure(target))
    h.state_dir = _state(tmp_path)
    opts = study_options(tmp_path, budget=3, screen=4, scenario="chat", trial_duration_s=4.0)
    res = run_optimize(opts, harness=h)
    assert res.screening is None and "screened" not in [t.role for t in res.trials]
    why = "no screening: the cluster runs haproxy, the target is fake; the search is live-only"
    assert why in res.notes
