"""A capacity study (``--objective capacity``) end to end over the fakes: trials scored by
the SLO stretch at the share asked, the winner confirmed on it, the report's rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lbtune.objective import make_spec, stretch_at, stretches
from lbtune.records.slo import Slo
from lbtune.search.judge import pooled_score
from lbtune.search.trial import Samples
from lbtune.tune.optimize import run_optimize
from tests.search.fakes import FakeMeasure, FakeTarget, harness, study_options

SLO_TEXT = "ttft=1s,tpot=100ms,e2e=2s"


def _study(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    target = FakeTarget()
    opts = study_options(
        tmp_path, objective="capacity", slo=SLO_TEXT, attainment=0.9, rate=5.0, **kw
    )
    spec = make_spec("capacity", slo=Slo(1.0, 2.0, tpot_s=0.1), attainment=0.9, rate=5.0)
    return run_optimize(opts, harness=harness(target, FakeMeasure(target, spec=spec)))


def test_trials_are_scored_by_the_slo_stretch_and_the_lowest_wins(tmp_path: Path) -> None:
    res = _study(tmp_path)
    assert res.spec.kind == "capacity" and res.spec.rate == 5.0
    assert res.spec.slo is not None and res.spec.slo.tpot_s == 0.1
    done = [t for t in res.trials if t.state == "COMPLETE" and t.figures is not None]
    assert len(done) >= 4
    for t in done:
        assert t.figures is not None and t.figures.slo_stretch is not None
        assert t.objective == t.figures.slo_stretch
    best = res.trial(res.best)
    assert best is not None and best.objective == min(t.objective or 9 for t in done)
    c = res.confirmation
    assert c is not None and c.verdict == "improved", c
    comp = next(x for x in c.comparisons if x.trial == c.winner)
    assert comp.candidate is not None and comp.baseline is not None
    assert comp.candidate.score is not None and comp.baseline.score is not None
    assert comp.candidate.score < comp.baseline.score  # lower stretch: more capacity
    assert comp.ci_high < 0


def test_the_report_says_the_stretch_the_rate_and_the_attainment(tmp_path: Path) -> None:
    res = _study(tmp_path)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "SLO stretch at P90 (lower is better)" in md
    assert "attainment at 5 req/s (%)" in md
    assert "every trial ran open loop at 5 req/s" in md
    assert "no twin capacity" in md  # the fakes have no twin: said, not left blank
    data = json.loads((tmp_path / "report" / "study.json").read_text())
    assert data["objective"]["kind"] == "capacity"
    assert data["objective"]["rate"] == 5.0 and data["objective"]["attainment"] == 0.9
    assert data["capacity"]["rate"] == 5.0
    assert res.capacity is not None and res.capacity.baseline is None


def test_the_confirmation_scores_pooled_requests_by_their_stretch() -> None:
    """The judge's pooled score under the capacity objective is the stretch of the runs'
    requests (and errors) taken together, TPOT included."""
    spec = make_spec("capacity", slo=Slo(1.0, 2.0, tpot_s=0.1), attainment=0.9, rate=5.0)
    rng = np.random.default_rng(1)
    runs = [
        Samples.of(rng.uniform(0, 1, 50), rng.uniform(1, 3, 50), 52, 2, rng.uniform(0, 0.2, 50))
        for _ in range(2)
    ]
    assert spec.slo is not None
    each = np.concatenate([stretches(r.ttft, r.tpot, r.e2e, r.errors, spec.slo) for r in runs])
    assert pooled_score(runs, spec) == stretch_at(each, 0.9)
    no_tpot = [Samples.of(r.ttft, r.e2e, r.sent, r.errors) for r in runs]
    assert pooled_score(no_tpot, spec) <= pooled_score(runs, spec)
