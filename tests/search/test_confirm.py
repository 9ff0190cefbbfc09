"""Confirmation and rollout: refuse a winner equal to the baseline, accept a clearly better one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lbtune.objective import ObjectiveSpec
from lbtune.search.judge import bootstrap_diff
from lbtune.search.trial import Samples
from lbtune.targets.base import ParamSet
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeMeasure, FakeTarget, harness


def _opts(tmp_path: Path, **kw: object) -> OptimizeOptions:
    base: dict[str, object] = dict(
        budget=8,
        study="c",
        storage=f"sqlite:///{tmp_path}/s.db",
        out_dir=tmp_path / "rep",
        seed=3,
        confirm_runs=2,
    )
    base.update(kw)
    return OptimizeOptions(**base)  # type: ignore[arg-type]


def _runs(scale: float, seeds: range, n: int = 300) -> list[Samples]:
    out = []
    for s in seeds:
        rng = np.random.default_rng(s)
        out.append(
            Samples.of(scale * 0.1 * rng.lognormal(0, 0.3, n), scale * rng.lognormal(0, 0.3, n))
        )
    return out


def test_bootstrap_ci_contains_zero_for_identical_distributions() -> None:
    diff, lo, hi = bootstrap_diff(_runs(1.0, range(3)), _runs(1.0, range(10, 13)), ObjectiveSpec())
    assert lo < 0 < hi
    assert lo <= diff <= hi


def test_bootstrap_ci_excludes_zero_for_a_clearly_better_candidate() -> None:
    diff, _lo, hi = bootstrap_diff(_runs(0.7, range(3)), _runs(1.0, range(10, 13)), ObjectiveSpec())
    assert hi < 0 and diff < 0


def test_every_candidate_equals_baseline_means_nothing_applied(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 0.7}
    measure = FakeMeasure(target, quality=lambda p: 1.0)  # no knob matters
    res = run_optimize(_opts(tmp_path), harness=harness(target, measure))
    c = res.confirmation
    assert c is not None
    assert c.verdict in ("no significant improvement", "baseline is best")
    assert c.winner is None and res.rollout is None
    assert target.live["x"] == 0.7  # the last known good (the user's live config) is back
    assert "nothing applied" in (tmp_path / "rep" / "report.md").read_text()


def test_clearly_better_candidate_is_confirmed_applied_and_verified(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}  # a bad live config: quality 1 + 4*0.64 + 0.4
    res = run_optimize(_opts(tmp_path, budget=10), harness=harness(target, FakeMeasure(target)))
    c = res.confirmation
    assert c is not None and c.verdict == "improved" and c.winner is not None
    assert c.order[:2] == ("A", "B1")  # interleaved, baseline first
    win = next(x for x in c.comparisons if x.trial == c.winner)
    assert win.ci_high < 0 and win.significant
    assert res.rollout is not None and res.rollout.applied and res.rollout.verified
    winner_params = res.trial(c.winner).params  # type: ignore[union-attr]
    assert target.live == winner_params and target.lkg == winner_params


def test_verification_worse_than_baseline_rolls_back(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}
    live0 = dict(target.live)

    def q(p: ParamSet) -> float:  # the winner degrades once rolled out (verify run)
        return 50.0 if measure.calls[-1] == "verify" else FakeMeasure.quality(p)

    measure = FakeMeasure(target)
    measure.quality = q
    res = run_optimize(_opts(tmp_path, budget=10), harness=harness(target, measure))
    r = res.rollout
    assert r is not None and r.applied and r.rolled_back and r.verified is False
    assert "worse than the baseline" in r.detail
    assert target.live == live0


def test_no_apply_stops_before_applying(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}
    live0 = dict(target.live)
    res = run_optimize(
        _opts(tmp_path, budget=10, apply=False), harness=harness(target, FakeMeasure(target))
    )
    assert res.confirmation is not None and res.confirmation.winner is not None
    assert res.rollout is None and target.live == live0
    assert any("--no-apply" in n for n in res.notes)


def test_bootstrap_pairs_requests_when_some_have_no_ttft() -> None:
    """Non-streamed requests carry NaN TTFT: resampling stays paired and ignores the NaNs."""
    import math

    spec = ObjectiveSpec()
    ttft = [0.1] * 80 + [math.nan] * 20
    base = [Samples.of(ttft, [1.0] * 100)]
    better = [Samples.of([0.05] * 80 + [math.nan] * 20, [0.5] * 100)]
    diff, lo, hi = bootstrap_diff(better, base, spec, n_boot=200)
    assert np.isfinite([diff, lo, hi]).all()
    assert hi < 0
