"""End to end on the embedded cluster: a slowed replica loses weight and traffic.

mini2 (H100 + L4 serving the 8B model) on free loopback ports in a tmp state dir;
closed-loop streaming load through HAProxy; the agent at a 1 s interval against the
cluster's real Prometheus and HAProxy; the L4 slowed 4x through the sim's admin API;
shares from HAProxy's per-server ``stot`` counters. About 30 s.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.records.endpoints import Endpoints
from lbtune.targets.haproxy.agent_check import slowdown_check
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from tests.agent.test_cli import cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        shutil.which("haproxy") is None or shutil.which("prometheus") is None,
        reason="haproxy and prometheus are needed",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    cfg, _ = load_config("mini2")
    state: Path = tmp_path_factory.mktemp("agent-mini2")
    try:
        yield api.up(cfg, state)
    finally:
        api.down(state)


def test_once_dry_run_prints_decisions_and_changes_nothing(cluster: Endpoints) -> None:
    before = {
        (s.backend, s.server): s.weight
        for s in HaproxyRuntime(cluster.balancer_details["runtime_socket"]).servers_state()
    }
    result = CliRunner().invoke(
        cli(), ["agent", "run", "--once", "--dry-run", "--json", "--state-dir", cluster.state_dir]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["applied"] is False
    rows = {r["replica"]: r for r in out["decisions"]}
    assert set(rows) == {r.name for r in cluster.replicas}
    assert all(r["score"] is not None and r["kv_norm"] is not None for r in rows.values())
    after = {
        (s.backend, s.server): s.weight
        for s in HaproxyRuntime(cluster.balancer_details["runtime_socket"]).servers_state()
    }
    assert after == before


def test_a_slowed_replica_loses_weight_and_traffic(cluster: Endpoints) -> None:
    report = slowdown_check(cluster, factor=4.0)
    assert report.errors == 0 and report.requests > 50
    assert report.weight_after < report.weight_before, report
    assert report.weight_after <= 0.8 * report.weight_before, report
    assert report.share_after < report.share_before - 0.05, report
    # it left the cluster as it found it
    rt = HaproxyRuntime(cluster.balancer_details["runtime_socket"])
    assert {s.weight for s in rt.servers_state()} == {100}
