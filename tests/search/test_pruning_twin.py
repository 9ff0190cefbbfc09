"""Pruning without survivorship bias, on the twin of a cluster with one slow replica.

Three simulated replicas behind HAProxy's routing: two H100s and one L4, which is ~6x
slower per token and shares its GPU among every request it holds (processor sharing), so
round robin's third of the traffic that lands on it is slow. Before censoring, a
checkpoint saw only the requests that had finished (the fast ones): round robin looked
good mid-trial (0.36 at its checkpoint, 6.9 at the end, in the issue's reproduction), the
median threshold sank below every good final score and the good configs were pruned.

The objective here is P99 TTFT alone (``--weights e2e=0,ttft=1,decay=0``): a request on
the L4 takes ~4 s, longer than a window (2 s), and its first token comes well within one,
so a checkpoint that counts the requests still running (with their TTFT, or their elapsed
time before it) can be right about it, and one that counts only finished requests cannot.
(With E2E in the score, no checkpoint earlier than the slow requests' latency can reach
their final P99: censoring gives a lower bound, not the future.)

Checked here: (0) the setup exposes the bias: recomputed from round robin's records, the
finished-only score at the first checkpoint is below 0.8x the final; (1) round robin's
intermediate values (censored) are never below 0.8x its final value; (2) a
small study with the default pruner reaches the region a ``--pruner none`` study
reaches: the best config sends the slow replica at most half its equal share of the
weight. Both studies use the same seed, so their (random start-up) samples are the same
configs and pruning is the only difference; that seed's samples include configs heavy
on the L4 (what the pruner should stop) and configs without it.

In virtual time (:class:`tests.search.twin_measure.TwinMeasure`): what is under test is the
study's pruning and the checkpoints it is shown, computed by the live path's own function
from the records as they stood; the same study against the live cluster took 165 s of the
suite, this one seconds. The live checkpoints themselves (the records' tail while the load
runs) are tested in ``tests/search/test_pruning_windows.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lbtune.cluster.twin import twin_cluster
from lbtune.metrics.censor import censored_samples
from lbtune.objective import Figures, composite
from lbtune.records.quantiles import percentile
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.targets.space import ParameterSpace
from lbtune.tune.optimize import run_optimize
from tests.conftest import M8
from tests.search.fakes import FakeTarget, harness, study_options
from tests.search.twin_measure import TwinMeasure

if TYPE_CHECKING:
    from lbtune.records.requests import RequestRecord
    from lbtune.search.result import StudyResult
    from lbtune.targets.base import ParamSet
    from lbtune.twin.result import TwinRun

CLUSTER = f"""\
name: slow3
time_scale: 1.0
seed: 0
ports: auto
replicas:
  - {{gpu: h100-80g, count: 2, models: [{M8}]}}
  - {{gpu: l4-24g, count: 1, models: [{M8}]}}
"""
# Prompts long enough that TTFTs are tens of ms, well above the generator's timing bound;
# outputs long enough that an L4 request outlasts a window; a warm-up (4 s) long enough
# for the L4's queue to fill (at 2 s, window 1 still saw it filling: 0.83x once).
SCENARIO = f"""\
name: slow3load
seed: 3
duration_s: 10.5
warmup_s: 4
cooldown_s: 1
slo: {{ttft: 1s, e2e: 5s}}
load: {{type: constant, users: 12}}
api: chat
models: {{{M8}: 1}}
prompt_tokens: {{type: lognormal, median: 300, sigma: 0.3, min: 8, max: 2048}}
output_tokens: {{type: lognormal, median: 40, sigma: 0.2, min: 2, max: 64}}
stream: true
"""
# Weights only, on a coarse grid (0 = no new requests), baseline = the cluster's live config.
SPACE = """\
target: haproxy
params:
  weight: {type: int, low: 0, high: 100, step: 25, baseline: 100, per_server: true, live: true}
"""
SLOW = "weight.l4-0"
WINDOW_S = 2.0


def _slow_share(params: ParamSet) -> float:
    weights = {k: float(v) for k, v in params.items() if k.startswith("weight.")}
    return weights[SLOW] / sum(weights.values())


def _finished_only(run: TwinRun, res: StudyResult) -> tuple[float, float]:
    """(final score, score at window 1 from the requests finished by then) of one run."""
    start, end = run.window.start, run.window.end
    records = list(run.records)

    def score(rs: list[RequestRecord], now: float | None = None) -> float:
        cs = censored_samples(rs, start=start, end=end, now=now)
        fig = Figures(percentile(cs.e2e, 99), percentile(cs.streamed_ttft or cs.e2e, 99))
        return composite(fig, res.spec)

    now = start + WINDOW_S
    # The rule before censoring: requests sent in the window and finished by the checkpoint
    # (the window's occupancy rule would bring in the warm-up's slow requests as well).
    seen = [r for r in records if r.sent_at >= start and r.ended_at <= now]
    return score(records), score(seen, now)


@pytest.mark.timeout(240)
def test_censored_pruning_keeps_round_robin_honest_and_finds_the_region(tmp_path: Path) -> None:
    (tmp_path / "slow3.yaml").write_text(CLUSTER)
    (tmp_path / "load.yaml").write_text(SCENARIO)
    (tmp_path / "space.yaml").write_text(SPACE)
    tc = twin_cluster(tmp_path / "slow3.yaml")
    space = ParameterSpace.load(tmp_path / "space.yaml", [r.name for r in tc.replicas])
    plan = plan_run(StressOptions(scenario=str(tmp_path / "load.yaml"), duration_s=10.5))
    results, measures = {}, {}
    for pruner in ("median", "none"):
        target = FakeTarget()
        target.fake_space = space
        target.live = space.baseline()  # the cluster's live config: round robin
        target.lkg = dict(target.live)
        measures[pruner] = measure = TwinMeasure(target, tc, plan, WINDOW_S)
        results[pruner] = run_optimize(
            study_options(
                tmp_path,
                budget=6,
                scenario=str(tmp_path / "load.yaml"),
                trial_duration_s=10.5,
                window_s=WINDOW_S,
                study=f"slow3-{pruner}",
                pruner=pruner,
                screen=0,  # the pruner acts on the study's measured trials only
                seed=1,
                weights="e2e=0,ttft=1,decay=0",
                confirm_runs=0,
                apply=False,
                out_dir=tmp_path / pruner,
            ),
            harness=harness(target, measure),
        )
    lines = []
    for pruner, res in results.items():
        for t in res.trials:
            lines.append(
                f"{pruner} #{t.number} {t.state} {t.params} {t.objective} {t.intermediate}"
            )
    print("\n".join(lines))
    final, first = _finished_only(measures["median"].runs["trial-0000"], results["median"])
    print(f"round robin finished-only at window 1: {first:.3f}, final {final:.3f}")
    assert first < 0.8 * final, (first, final)  # what the pruner saw before censoring
    for pruner, res in results.items():
        rr = res.trial(0)
        assert rr is not None and rr.role == "live" and rr.state == "COMPLETE", lines
        assert _slow_share(rr.params) == pytest.approx(1 / 3)  # the live config: round robin
        assert rr.objective is not None and rr.intermediate, lines
        for step, value in rr.intermediate.items():
            assert value >= 0.8 * rr.objective, (pruner, step, value, rr.objective)
        best = res.trial(res.best) if res.best is not None else None
        assert best is not None, lines
        # The region: the slow replica gets at most half of its equal share of the weight.
        assert _slow_share(best.params) <= 1 / 6, (pruner, best.params, lines)
    pruned = [t.number for t in results["median"].trials if t.state == "PRUNED"]
    assert pruned, f"the median pruner stopped no trial, so nothing here tested it: {lines}"
