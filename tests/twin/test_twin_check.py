"""``lbtune twin check`` (:mod:`lbtune.tune.twincheck`): the configs it draws, its bounds,
and one short check against a live mini2 (the live config put back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, load_config
from lbtune.cluster.twin import space_path, twin_cluster
from lbtune.errors import ConfigError
from lbtune.targets import get_target
from lbtune.targets.space import ParameterSpace
from lbtune.tune.twincheck import CheckOptions, check_twin, draw_configs
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
    ],
)
def test_bounds_are_one_line(opts: CheckOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_twin(opts, print)


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
        res = check_twin(CheckOptions("chat", 3, 6.0, state_dir=state), said.append)
        assert target.read_live() == before
    finally:
        api.down(state)
    assert [r.config for r in res.rows] == [0, 1, 2]
    assert res.rows[1].params["algorithm"] == "leastconn"  # the live config is round robin
    assert set(res.errors) == {"p99_e2e_s", "p99_ttft_s", "requests_per_s"}
    # ballpark, not fidelity: 6 s runs at time scale 8; the fidelity benchmark measures it
    assert res.errors["requests_per_s"] < 0.5
    assert all(lo <= res.errors[m] <= hi for m, (lo, hi) in res.errors_ci.items())
    assert sum("measured live" in s for s in said) == 3
