"""A small live-vs-twin check: mini2 measured live and simulated, three configs far apart.

The embedded mini2 cluster (H100 + L4) at time scale 8 on free ports; round robin,
least-conn and weights skewed to the slow L4, each applied through the target's direct
path and measured for 10 s of ``chat``; the twin replays each recorded plan with the same
params, carrying the replicas' caches from run to run as the live cluster does. The
twin's P99 E2E, P99 TTFT and req/s must be in the live ballpark and rank the configs as
the live runs do. Run under the machine's lock::

    flock /tmp/lbtune-live.lock .venv/bin/pytest -m integration tests/twin/test_live_vs_twin.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, load_config
from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.loadgen.recordio import read_records
from lbtune.run.stress import StressOptions, run_stress
from lbtune.targets import get_target
from lbtune.tune.virtual import twin_figures
from lbtune.twin.options import TwinOptions
from lbtune.twin.result import TwinRun
from lbtune.twin.run import Reuse, simulate
from tests.conftest import have_cluster_binaries

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cluster_binaries(), reason="haproxy and prometheus needed"),
    pytest.mark.timeout(240),
]
SCALE = 8.0
CONFIGS: dict[str, dict[str, int | float | str | bool]] = {
    "rr": {"algorithm": "roundrobin"},
    "lc": {"algorithm": "leastconn"},
    "l4-heavy": {"algorithm": "roundrobin", "weight.h100-0": 10, "weight.l4-0": 256},
}


def test_the_twin_ranks_and_sizes_configs_like_the_live_cluster(tmp_path: Path) -> None:
    cfg = load_config("mini2")[0]
    ports = PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))
    cfg = cfg.model_copy(update={"ports": ports, "time_scale": SCALE})
    state = tmp_path / "cluster"
    tc = twin_cluster("mini2")
    base, _ = twin_params(tc)
    live: dict[str, tuple[float, float, float]] = {}
    twin: dict[str, tuple[float, float, float]] = {}
    ep = api.up(cfg, state)
    engines = None
    try:
        target = get_target("haproxy", ep)
        for name, knobs in CONFIGS.items():
            params = {**base, **knobs}
            target.apply(params)
            res = run_stress(
                StressOptions(
                    scenario="chat", duration_s=10, state_dir=state, out_dir=tmp_path / name
                ),
                say=lambda m: None,
            )
            plan = res.plan
            recs = tuple(read_records(res.records_path))
            assert plan.started_at is not None
            as_run = TwinRun(recs, plan, res.load.ended_at, run_start=plan.started_at)
            fig, _ = twin_figures(as_run)
            live[name] = (fig.p99_e2e_s, fig.p99_ttft_s, fig.requests_per_s)
            model = tc.routing(params)
            run = simulate(plan, tc.replicas, model, TwinOptions(SCALE), Reuse(engines=engines))
            engines = run.engines
            fig, _ = twin_figures(run)
            twin[name] = (fig.p99_e2e_s, fig.p99_ttft_s, fig.requests_per_s)
    finally:
        api.down(state)
    for name in CONFIGS:
        (le, lt, lr), (te, tt, tr) = live[name], twin[name]
        assert 0.6 < te / le < 1.6, (name, live[name], twin[name])
        assert 0.4 < tt / lt < 2.5, (name, live[name], twin[name])
        assert 0.75 < tr / lr < 1.33, (name, live[name], twin[name])
    by_rate = sorted(CONFIGS, key=lambda n: live[n][2])
    assert sorted(CONFIGS, key=lambda n: twin[n][2]) == by_rate, (live, twin)
    best = min(CONFIGS, key=lambda n: live[n][0])  # rr and l4-heavy are within a few %
    assert min(CONFIGS, key=lambda n: twin[n][0]) == best, (live, twin)
