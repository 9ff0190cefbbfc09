"""A capacity study's pieces on the twin: the trials' figures (SLO stretch, attainment)
computed as a capacity search computes them, and the rate the twin places the trials at."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.capacity.attainment import attainment
from lbtune.capacity.probes import Probes, ProbeShape, TwinProbe
from lbtune.capacity.search import SearchOptions, for_twin, search
from lbtune.capacity.twincase import twin_case
from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.errors import ConfigError
from lbtune.objective import make_spec, stretch_at, stretches
from lbtune.records.slo import Slo
from lbtune.run.stress import StressOptions
from lbtune.tune.capacity_study import RATE_FACTOR, trial_rate, twin_capacities
from lbtune.tune.virtual import twin_figures
from lbtune.twin.run import simulate
from tests.twin.helpers import plan

SLO = Slo(ttft_s=1.0, e2e_s=20.0, tpot_s=0.1)
TRIALS = StressOptions(scenario="chat", duration_s=12.0, seed=3)


def test_a_twin_trial_carries_the_stretch_and_the_attainment_of_its_window() -> None:
    spec = make_spec("capacity", slo=SLO, attainment=0.95, rate=8.0)
    p = plan("chat", 30.0, rate=8.0, seed=3)
    tc = twin_cluster("hetero4")
    values, _ = twin_params(tc)
    run = simulate(p, tc.replicas, tc.routing(values), tc.options())
    fig, score = twin_figures(run, spec)
    cs = run.censored()
    want = stretch_at(stretches(cs.ttft, cs.tpot, cs.e2e, cs.errors, SLO), 0.95)
    assert fig.slo_stretch == pytest.approx(want) and score == fig.slo_stretch
    got = attainment(run.records, (run.window.start, run.window.end), SLO)
    assert fig.attainment == pytest.approx(got.met / got.judged)
    assert any(t == t for t in cs.tpot)  # streamed chat: TPOTs were judged


def test_the_trials_run_past_the_live_configs_capacity_in_the_twin(tmp_path: Path) -> None:
    """No cluster running in ``tmp_path``: the default preset's twin, its baseline config."""
    said: list[str] = []
    rate = trial_rate(TRIALS, SLO, 0.95, tmp_path, said.append)
    probes = Probes(TRIALS, ProbeShape(), "req/s")
    case = twin_case(tmp_path)
    est = search(TwinProbe(probes, SLO, case), for_twin(SearchOptions(0.95, 0.1))).estimate
    assert est.capacity is not None
    assert rate == pytest.approx(est.capacity * RATE_FACTOR, rel=1e-3)
    assert f"{rate:g} req/s" in said[0]


def test_an_slo_no_rate_meets_names_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--rate R") as err:
        trial_rate(TRIALS, Slo(ttft_s=0.001, e2e_s=0.002), 0.95, tmp_path, lambda m: None)
    assert "\n" not in str(err.value)


def test_before_and_after_capacities_of_two_configs(tmp_path: Path) -> None:
    """Least-conn against round robin on hetero4 (a 6x slower L4): more capacity."""
    spec = make_spec("capacity", slo=SLO, attainment=0.95, rate=10.0)
    rr, lc = {"algorithm": "roundrobin"}, {"algorithm": "leastconn"}
    row = twin_capacities(TRIALS, spec, tmp_path, rr, lc, probe_s=TRIALS.duration_s)
    assert row.note is None and row.baseline is not None and row.winner is not None
    assert row.winner > row.baseline
    assert (row.rate, row.attainment, row.slo) == (10.0, 0.95, SLO)
