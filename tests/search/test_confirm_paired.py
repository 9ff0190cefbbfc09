"""Paired confirmation: same rounds, a freshly measured baseline, enough samples, a cap.

Why a fake measurement (:class:`RoundMeasure`): these properties are about which runs
the verdict and the report use, not about the cluster. The fake knows which round a
run belongs to (from its label) and makes the cluster drift between rounds, so a
comparison across rounds would be visibly wrong; it also fails chosen runs and counts
wall time on a fake clock, which a real run cannot do on demand.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from lbtune.errors import LbtuneError, TrialFailed
from lbtune.objective import Figures, ObjectiveSpec
from lbtune.records.quantiles import percentile
from lbtune.report.study_frame import before_after, rounds_table
from lbtune.search.confirm import Arm, BaselineUnmeasurable, confirm
from lbtune.search.judge import bootstrap_diff
from lbtune.search.result import StudyResult, TrialResult
from lbtune.search.trial import Measurement, Samples, TrialRunner, WindowHook
from lbtune.targets.base import ParamSet
from lbtune.tune.optimize import run_optimize
from lbtune.tune.options import OptimizeOptions
from tests.search.fakes import FakeTarget, harness, quality

DRIFT = {1: 1.0, 2: 2.0, 3: 4.0, 4: 1.5, 5: 3.0, 6: 2.5}
"""The cluster's slowdown in each confirmation round."""


@dataclass
class RoundMeasure:
    """Latencies scaled by the live params' quality and by the round's drift."""

    target: FakeTarget
    n: int = 300
    fail: Callable[[str, ParamSet], bool] = lambda label, params: False
    clock: list[float] = field(default_factory=lambda: [0.0])
    seconds_per_run: float = 1.0
    calls: list[str] = field(default_factory=list)
    samples: dict[str, Samples] = field(default_factory=dict)

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        self.calls.append(label)
        self.clock[0] += self.seconds_per_run
        live = dict(self.target.live)
        if self.fail(label, live):
            raise TrialFailed(f"fake failure of {label}")
        found = re.match(r"confirm-(\d+)-", label)
        drift = DRIFT[int(found.group(1))] if found else 0.5
        scale = quality(live) * drift
        rng = np.random.default_rng(int(hashlib.sha256(label.encode()).hexdigest()[:8], 16))
        e2e = scale * rng.lognormal(0.0, 0.3, self.n)
        ttft = scale * 0.1 * rng.lognormal(0.0, 0.3, self.n)
        s = Samples.of(ttft, e2e, self.n, 0)
        self.samples[label] = s
        fig = Figures(
            p99_e2e_s=percentile(list(e2e), 99),
            p99_ttft_s=percentile(list(ttft), 99),
            requests_per_s=10.0 / scale,
            completed=self.n,
        )
        return Measurement(fig, s)


def _runner(target: FakeTarget, ms: RoundMeasure) -> TrialRunner:
    return TrialRunner(target, ms)


def _arms(target: FakeTarget) -> tuple[Arm, list[Arm]]:
    live = {**target.live, "x": 1.0}
    good = {**target.live, "x": 0.2, "algorithm": "leastconn"}
    target.live = dict(live)
    return Arm("A", 0, live), [Arm("B1", 5, good)]


def _pool(ms: RoundMeasure, labels: list[str], attr: str) -> np.ndarray:
    return np.concatenate([getattr(ms.samples[x], attr) for x in labels])


def test_before_after_compares_the_same_rounds_and_never_the_search_run() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    # The candidate's round-2 run fails twice (run and retry): round 2 is dropped for
    # both arms, though the baseline's round-2 run (a slow round) was measured.
    ms = RoundMeasure(target, fail=lambda label, p: label.startswith("confirm-2-B1"))
    c = confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=3)
    comp = c.comparisons[0]
    assert comp.rounds == (1, 3)
    assert c.order == ("A", "B1", "A", "B1", "A", "B1")
    # Hand-formatted: one round per line (arm A, then B1), the table the rounds are.
    assert [(r.round, r.arm, r.measured) for r in c.rounds] == [
        (1, "A", True), (1, "B1", True),
        (2, "A", True), (2, "B1", False),
        (3, "A", True), (3, "B1", True),
    ]  # fmt: skip
    search_live = Figures(p99_e2e_s=0.1, p99_ttft_s=0.01, requests_per_s=99.0)  # a fast run
    result = StudyResult(
        study="s",
        storage="sqlite://",
        target="fake",
        scenario="x",
        sampler="tpe",
        spec=ObjectiveSpec(),
        budget=2,
        best=5,
        baseline=0,
        confirmation=c,
        trials=(
            TrialResult(0, "COMPLETE", "live", base.params, 0.2, figures=search_live),
            TrialResult(5, "COMPLETE", "sampled", cands[0].params, 0.1, figures=search_live),
        ),
    )
    table = before_after(result)
    rows = {r[0]: r for r in table.rows}
    a_e2e = _pool(ms, ["confirm-1-A", "confirm-3-A"], "e2e")
    b_e2e = _pool(ms, ["confirm-1-B1", "confirm-3-B1"], "e2e")
    a_ttft = _pool(ms, ["confirm-1-A", "confirm-3-A"], "ttft")
    assert rows["P99 end-to-end latency (ms)"][1] == percentile(list(a_e2e), 99) * 1000.0
    assert rows["P99 end-to-end latency (ms)"][2] == percentile(list(b_e2e), 99) * 1000.0
    assert rows["P50 time to first token (ms)"][1] == percentile(list(a_ttft), 50) * 1000.0
    assert rows["P99 end-to-end latency (ms)"][1] != search_live.p99_e2e_s * 1000.0
    assert rows["latency samples (requests)"][1:3] == (600, 600)
    # Downstream consumers (history, compare, JUnit) get the same pooled figures.
    assert comp.figures is not None and comp.baseline_figures is not None
    assert comp.figures.p99_e2e_s == percentile(list(b_e2e), 99)
    assert comp.baseline_figures.p99_e2e_s == percentile(list(a_e2e), 99)
    assert "rounds 1, 3" in table.columns[1] and "same rounds" in table.columns[3]
    # The candidate is 3.96x faster in every round (quality 1.0 vs 3.96): the change
    # says so (-75 %) although the drift between the rounds used is 4x.
    change = float(str(rows["P99 end-to-end latency (ms)"][3]).split()[0])
    assert -80 < change < -70
    assert len(rounds_table(result).rows) == 6


def test_pairing_removes_the_drift_between_rounds() -> None:
    """10 % better in every round, with 4x drift between rounds: only pairing sees it."""
    rng = np.random.default_rng(1)
    base, cand = [], []
    for drift in (1.0, 2.0, 4.0):
        e = rng.lognormal(0, 0.3, 400)
        base.append(Samples.of(0.1 * drift * e, drift * e))
        cand.append(Samples.of(0.09 * drift * e, 0.9 * drift * e))
    spec = ObjectiveSpec()
    _d, _lo, hi = bootstrap_diff(cand, base, spec, paired=True, n_boot=300)
    _d2, lo2, hi2 = bootstrap_diff(cand, base, spec, paired=False, n_boot=300)
    assert hi < 0
    assert lo2 < 0 < hi2


def test_a_failed_trial_0_still_confirms_against_a_fresh_baseline(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}
    live = dict(target.live)
    # Every search run of the live config fails; its confirmation runs work.
    ms = RoundMeasure(target, fail=lambda label, p: label.startswith("trial-") and p == live)
    res = run_optimize(
        OptimizeOptions(
            budget=8,
            study="f",
            storage=f"sqlite:///{tmp_path}/s.db",
            out_dir=tmp_path / "r",
            seed=3,
            confirm_runs=2,
        ),
        harness=harness(target, ms),
    )
    t0 = res.trial(0)
    assert t0 is not None and t0.role == "live" and t0.state == "FAIL"
    c = res.confirmation
    assert c is not None and c.baseline_trial == 0 and c.order[0] == "A"
    assert "confirm-1-A" in ms.calls  # the baseline was measured afresh
    assert c.verdict == "improved" and res.rollout is not None and res.rollout.applied


def test_an_unmeasurable_baseline_is_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    target = FakeTarget()
    target.live = {**target.live, "x": 1.0}
    live = dict(target.live)
    ms = RoundMeasure(target, fail=lambda label, p: label.startswith("confirm-") and p == live)
    with pytest.raises(BaselineUnmeasurable) as info:
        run_optimize(
            OptimizeOptions(
                budget=6,
                study="u",
                storage=f"sqlite:///{tmp_path}/s.db",
                out_dir=tmp_path / "r",
                seed=3,
                confirm_runs=2,
            ),
            harness=harness(target, ms),
        )
    exc = info.value
    assert isinstance(exc, LbtuneError) and exc.exit_code == 2
    assert "\n" not in str(exc) and "could not be measured" in str(exc)
    assert not any(x.startswith("confirm-") and "-B" in x for x in ms.calls)  # nothing to pair
    assert target.live == live  # the last known good is back
    report = (tmp_path / "r" / "report.md").read_text()
    assert "could not be measured" in report


def test_the_cli_prints_an_unmeasurable_baseline_as_one_line() -> None:
    import subprocess
    import sys

    code = (
        "import sys, lbtune.tune.optimize as o\n"
        "from lbtune.search.confirm import BaselineUnmeasurable\n"
        "def boom(*a, **k): raise BaselineUnmeasurable('the live configuration (trial 0) "
        "could not be measured')\n"
        "o.run_optimize = boom\n"
        "sys.argv = ['lbtune', 'optimize', '--budget', '2']\n"
        "from lbtune.cli import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: the live configuration (trial 0) could not be measured")
    assert "Traceback" not in done.stderr


def test_rounds_are_added_until_every_arm_has_a_p99() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, n=30)
    c = confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=2, max_rounds=6)
    assert c.runs_per_arm == 4  # 4 x 30 = 120 >= 100 samples per arm
    assert c.quantile == 99.0 and c.note == ""
    assert c.comparisons[0].candidate is not None
    assert c.comparisons[0].candidate.requests == 120


def test_the_round_cap_is_said_and_the_tail_falls_back_to_p95() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, n=15)
    c = confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=2, max_rounds=3)
    assert c.runs_per_arm == 3
    assert c.quantile == 95.0
    assert "P99 from 45 samples: not enough; reporting P95" in c.note
    assert "cap 3 rounds" in c.note
    comp = c.comparisons[0]
    assert comp.baseline is not None
    pooled = _pool(ms, ["confirm-1-A", "confirm-2-A", "confirm-3-A"], "e2e")
    assert comp.baseline.tail_e2e_s == percentile(list(pooled), 95)


def test_the_time_cap_stops_adding_rounds() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, n=30, seconds_per_run=60.0)
    c = confirm(
        _runner(target, ms),
        base,
        cands,
        ObjectiveSpec(),
        runs=2,
        max_rounds=10,
        max_s=300.0,
        clock=lambda: ms.clock[0],
    )
    # 2 rounds take 240 s; a third would end at ~360 s > 300 s: not started.
    assert c.runs_per_arm == 2
    assert c.quantile == 95.0 and "300 s" in c.note


def test_a_round_whose_baseline_failed_is_void_and_replaced() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, fail=lambda label, p: label.startswith("confirm-1-A"))
    c = confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=2)
    assert c.comparisons[0].rounds == (2, 3)  # two rounds with a baseline, as asked
    assert not any(x.startswith("confirm-1-B1") for x in ms.calls)  # nothing to pair with
    row = next(r for r in c.rounds if (r.round, r.arm) == (1, "B1"))
    assert not row.measured and "baseline of this round failed" in row.reason


def test_a_baseline_that_never_measures_is_given_up_after_three_rounds() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, fail=lambda label, p: "-A" in label)
    with pytest.raises(BaselineUnmeasurable, match="any of 3 confirmation round"):
        confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=2, max_rounds=6)
    assert len(ms.calls) == 6  # 3 rounds, each baseline run retried once; no candidate run


def test_a_candidate_that_never_measures_is_dropped_after_three_rounds() -> None:
    target = FakeTarget()
    base, cands = _arms(target)
    ms = RoundMeasure(target, fail=lambda label, p: "-B1" in label)
    c = confirm(_runner(target, ms), base, cands, ObjectiveSpec(), runs=2, max_rounds=6)
    assert c.runs_per_arm == 3  # not 6: the candidate was given up, no more rounds
    assert sum("-B1" in x for x in ms.calls) == 6  # 3 rounds, each retried once
    assert c.verdict == "no significant improvement" and c.winner is None
    assert c.comparisons[0].rounds == ()
