"""A balancer relaunched by a heal (the keeper's, or ``up``'s on a running cluster) runs
off the CPUs the cluster's servers are pinned to, as ``up`` launched it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lbtune import targets
from lbtune.cluster import heal, health
from lbtune.process import affinity, supervisor
from lbtune.process.supervisor import ClusterSupervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import BalancerLaunch, LaunchSpec
from tests.records.test_endpoints import old_record

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class _Sleeper:
    """A balancer that is one sleeping process."""

    def launch(self, spec: LaunchSpec, sup: ClusterSupervisor) -> BalancerLaunch:
        sup.start("haproxy", SLEEPER)
        return BalancerLaunch(("haproxy",), "-", "-")


@pytest.mark.skipif(
    len(affinity.usable()) < 2,
    reason="pinning to a subset needs at least 2 CPUs this process may use",
)
def test_a_relaunched_balancer_runs_off_the_servers_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = StatePaths(tmp_path)
    paths.create()
    usable = affinity.usable()
    reserved = [max(usable)]
    ep = Endpoints.model_validate({**old_record(tmp_path), "reserved_cpus": reserved})
    spec = LaunchSpec("t", tmp_path, "127.0.0.1", 9, 9, {}, (), (), {})
    heal.save_launch(paths, spec)
    monkeypatch.setattr(targets, "balancer", lambda name: _Sleeper())
    monkeypatch.setattr(health, "prometheus_missing", lambda ep: None)
    said: list[str] = []
    heal.heal_balancer(ep, paths, [], said.append, scrape_timeout_s=5)
    rec = supervisor.read_record(paths, "haproxy")
    assert rec is not None
    try:
        assert os.sched_getaffinity(rec.pid) == usable - set(reserved)
    finally:
        supervisor.stop(rec, paths, timeout=5)
    assert said[-1].startswith("haproxy relaunched")
