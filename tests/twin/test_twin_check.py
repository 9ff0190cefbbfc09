"""``lbtune twin check`` (:mod:`lbtune.tune.twincheck`): the configs it draws, its bounds,
and one short check against a live mini2 (the live config put back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, load_config
from lbtune.cluster.twin import space_path, twin_cluster
from lbtune.errors import ConfigError
from lbtune.objective import Figures
from lbtune.targets import get_target
from lbtune.targets.space import ParameterSpace
from lbtune.tune.twincheck import (
    CheckOptions,
    CheckRow,
    check_twin,
    config_means,
    draw_configs,
    round_order,
)
from tests.conftest import have_cluster_binaries


def _space() -> ParameterSpace:
    return ParameterSpace.load(
        space_path("haproxy"), [r.name for r in twin_cluster("mini2").replicas]
    )


def test_the_live_config_and_the_references_first_then_distinct_draws() -> None:
    space = _space()
    live = {**space.baseline(), "algorithm": "random"}
    configs = draw_configs(space, live, 6, seed=1)
    assert len(configs) == 6 and configs[0] == live
    assert [c["algorithm"] for c in configs[1:3]] == ["roundrobin", "leastconn"]
    assert all(a != b for i, a in enumerate(configs) for b in configs[i + 1 :])
    assert draw_configs(space, live, 6, seed=1) == configs


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (CheckOptions(configs=2), r"^--configs: 3 to 20, got 2$"),
        (CheckOptions(duration_s=120), r"^--duration: 5 to 60 s, got 120$"),
        (CheckOptions(rounds=5), r"^--rounds: 1 to 4, got 5$"),
    ],
)
def test_bounds_are_one_line(opts: CheckOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_twin(opts, print)


def test_rounds_alternate_direction_so_a_steady_drift_hits_every_config_alike() -> None:
    order = round_order(3, 4)
    assert order[:6] == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert [(r - 2, c) for r, c in order[6:]] == order[:6]
    # a drift of one unit per run: every config's mean position is the same
    mean_pos = {c: sum(i for i, (_, x) in enumerate(order) if x == c) / 4 for c in range(3)}
    assert len(set(mean_pos.values())) == 1
    assert round_order(3, 1) == [(0, 0), (0, 1), (0, 2)]


def _row(config: int, e2e: float, rps: float, score: float) -> CheckRow:
    f = Figures(p99_e2e_s=e2e, p99_ttft_s=e2e / 10, requests_per_s=rps, completed=7)
    return CheckRow(config, {"algorithm": str(config)}, f, f, score, score / 2)


def test_a_configs_rounds_become_their_means() -> None:
    rows = [_row(1, 2.0, 10.0, 0.4), _row(0, 1.0, 8.0, 0.2), _row(1, 4.0, 12.0, 0.6)]
    got = config_means(rows)
    assert [r.config for r in got] == [0, 1]
    assert got[0] == rows[1]
    one = got[1]
    figs = (one.live.p99_e2e_s, one.live.p99_ttft_s, one.live.requests_per_s)
    assert figs == pytest.approx((3.0, 0.3, 11.0))
    assert one.live_score == pytest.approx(0.5) and one.twin_score == pytest.approx(0.25)
    assert one.live.completed == 7  # the figures a check does not compare: the first run's


def test_no_cluster_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no cluster running"):
        check_twin(CheckOptions(state_dir=tmp_path), print)


@pytest.mark.integration
@pytest.mark.skipif(not have_cluster_binaries(), reason="haproxy and prometheus needed")
@pytest.mark.timeout(240)
def test_a_short_check_against_the_live_cluster(tmp_path: Path) -> None:
    cfg = load_config("mini2")[0]
    ports = PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))
    cfg = cfg.model_copy(update={"ports": ports, "time_scale": 8.0})
    state = tmp_path / "cluster"
    ep = api.up(cfg, state)
    try:
        target = get_target("haproxy", ep)
        before = target.read_live()
        said: list[str] = []
        opts = CheckOptions("chat", 3, 5.0, state_dir=state, rounds=2)
        res = check_twin(opts, said.append)
        assert target.read_live() == before
    finally:
        api.down(state)
    assert [r.config for r in res.rows] == [0, 1, 2]
    assert res.rows[1].params["algorithm"] == "leastconn"  # the live config is round robin
    assert set(res.errors) == {"p99_e2e_s", "p99_ttft_s", "requests_per_s"}
    # ballpark, not fidelity: 6 s runs at time scale 8; the fidelity benchmark measures it
    assert res.errors["requests_per_s"] < 0.5
    assert all(lo <= res.errors[m] <= hi for m, (lo, hi) in res.errors_ci.items())
    assert res.rounds == 2
    live = [s for s in said if "measured live" in s]
    assert len(live) == 6 and "config 2 (" in live[3] and "round 2/2" in live[3]
