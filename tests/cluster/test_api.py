"""``up`` records the CPUs its vLLM servers are pinned to once, in the endpoints: the
rest of the cluster and the load generator run on the others."""

from __future__ import annotations

from pathlib import Path

from lbtune import targets
from lbtune.cluster.api import _endpoints, launch_spec
from lbtune.cluster.config import load_config
from lbtune.cluster.resolve import resolve
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import BalancerLaunch


def test_the_vllm_preset_reserves_its_servers_cpus() -> None:
    cfg, _ = load_config("vllm-cpu")
    assert cfg.reserved_cpus == [1]
    assert load_config("mini2")[0].reserved_cpus == []


def test_the_endpoints_record_the_servers_cpus(tmp_path: Path) -> None:
    cluster = resolve(load_config("vllm-cpu")[0])
    paths = StatePaths(tmp_path)
    entry = targets.balancer(cluster.config.balancer)
    spec = launch_spec(cluster, paths, entry)
    ep = _endpoints(cluster, paths, "-", entry, spec, BalancerLaunch(("haproxy",), "-", "-"))
    assert ep.reserved_cpus == [1]
