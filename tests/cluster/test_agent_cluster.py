"""The embedded cluster runs the feedback agent when its YAML enables it.

One mini2-agent cluster (H100 + L4 serving the 8B, ports auto, tmp state dir, time scale
4): ``up`` starts the agent after HAProxy and Prometheus, Prometheus scrapes it, a slowed
L4 loses weight and new requests (HAProxy ``stot`` deltas) to the agent the cluster runs,
the HAProxy target's agent knobs reach that agent, and ``down`` stops it first. ~35 s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_api_client import PrometheusConnect

from lbtune.agent.config import AgentConfig, read_agent_file
from lbtune.apply import apply_params
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.process import supervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import RejectedBeforeApply
from lbtune.targets.haproxy.agent_check import slowdown_check
from lbtune.targets.haproxy.target import HaproxyTarget
from tests.cluster.conftest import alive, needs_binaries, started_pids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120), needs_binaries]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    cfg, _ = load_config("mini2-agent")
    state = tmp_path_factory.mktemp("mini2-agent")
    try:
        yield api.up(cfg, state)
    finally:
        api.down(state)


def _started(pid: int | None) -> float:
    assert pid is not None
    return float(psutil.Process(pid).create_time())


def _agent_pid(ep: Endpoints) -> int:
    record = supervisor.read_record(StatePaths(Path(ep.state_dir)), "agent")
    assert record is not None
    return record.pid


def test_the_agent_runs_after_haproxy_and_prometheus_and_is_scraped(cluster: Endpoints) -> None:
    assert cluster.agent_config is not None and cluster.agent_metrics_url is not None
    st = api.status(cluster.state_dir)
    assert st.healthy, st.problems
    components = {c.name: c for c in st.components}
    assert components["agent"].running and components["agent"].log.endswith("logs/agent.log")
    # started after HAProxy and Prometheus were ready; only the keeper comes after it
    order = sorted(components, key=lambda n: _started(components[n].pid))
    assert order[-2:] == ["agent", "keeper"] and components["keeper"].running
    settings = read_agent_file(cluster.agent_config)
    assert settings["state_dir"] == cluster.state_dir
    assert settings["prometheus_url"] == cluster.prometheus_url
    assert f":{settings['metrics_port']}/" in cluster.agent_metrics_url
    prom = PrometheusConnect(cluster.prometheus_url, disable_ssl=True)
    up = prom.custom_query('up{job="lbtune-agent"}')
    assert up and up[0]["value"][1] == "1"
    steps = prom.custom_query("lbtune_agent_iterations_total")
    assert steps and float(steps[0]["value"][1]) >= 1


def test_a_slowed_replica_loses_weight_and_traffic_to_the_clusters_agent(
    cluster: Endpoints,
) -> None:
    pid = _agent_pid(cluster)
    report = slowdown_check(cluster, factor=4.0, run_agent=False)
    print(report)
    assert report.replica == "l4-0" and report.errors == 0 and report.requests > 50
    assert report.weight_after <= 0.8 * report.weight_before, report
    # within a few 1 s intervals of the slowdown (the TTFT window is 4 s)
    reaction = report.seconds_to(0.8 * report.weight_before)
    assert reaction is not None and reaction <= 8.0, report.samples
    assert report.share_after < report.share_before - 0.05, report
    assert _agent_pid(cluster) == pid and alive(pid)  # the cluster's agent did it


def test_the_haproxy_target_leaves_weights_to_the_agent_and_tunes_its_knobs(
    cluster: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    target = HaproxyTarget(cluster)
    assert target.space().params["weight.l4-0"].fixed
    with pytest.raises(RejectedBeforeApply, match="the feedback agent owns the per-server weights"):
        apply_params(target, {"weight.l4-0": 5}, via="direct")
    before = read_agent_file(str(cluster.agent_config))
    log = Path(cluster.state_dir) / "logs" / "agent.log"
    reloads = log.read_text().count("config reloaded")
    with caplog.at_level(logging.WARNING, logger="lbtune.targets.haproxy.target"):
        outcome = apply_params(target, {"agent.max_step": 16, "weight.l4-0": 5}, via="direct")
    assert "ignoring weight.l4-0" in caplog.text
    assert outcome.result.diff == {"agent.max_step": (32, 16)}
    after = read_agent_file(str(cluster.agent_config))
    assert {k: after[k] for k in before} == before  # the cluster's wiring and settings kept
    assert AgentConfig(**after) == AgentConfig(**before).model_copy(update={"max_step": 16})
    deadline = time.monotonic() + 10
    while log.read_text().count("config reloaded") == reloads and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "max_step" in log.read_text().rsplit("config reloaded", 1)[-1].splitlines()[0]
    # the agent moves the weights between applies: still no change of ours
    assert target.apply({"agent.max_step": 16}).changed is False
    assert target.read_live()["agent.max_step"] == 16


def test_down_stops_the_agent_first_and_leaves_nothing(cluster: Endpoints) -> None:
    """First the keeper (it would relaunch the balancer), then the agent."""
    state = Path(cluster.state_dir)
    pids = started_pids(state)
    agent_pid = _agent_pid(cluster)
    stopped = api.down(state)
    assert list(stopped)[:2] == ["keeper", "agent"] and stopped["agent"] == [agent_pid]
    assert not [p for p in pids if alive(p)]
    assert not list(state.glob("*.pid"))
