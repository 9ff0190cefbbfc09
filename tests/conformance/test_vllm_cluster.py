"""The ``vllm:`` section of a cluster YAML: validation, the server command, and one real
cluster (one pinned vLLM behind HAProxy and Prometheus) up and down."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from lbtune.cluster import api, vllm
from lbtune.cluster.config import load_config, parse_config
from lbtune.cluster.resolve import resolve
from lbtune.errors import ConfigError
from lbtune.records.endpoints import Endpoints
from tests.conformance.conftest import MODEL


def test_preset_resolves_to_pinned_vllm_replicas() -> None:
    cfg, _ = load_config("vllm-cpu")
    assert cfg.vllm is not None and cfg.vllm.cpus == [1] and cfg.vllm.model == MODEL
    replicas = resolve(cfg).replicas
    assert [r.name for r in replicas] == ["vllm-0", "vllm-1"]
    assert all(r.vllm and r.external and r.models == (MODEL,) for r in replicas)
    assert len({r.port for r in replicas}) == 2


def test_one_source_of_replicas() -> None:
    doc = {
        "name": "x",
        "vllm": {"count": 1},
        "external": [{"name": "e", "url": "http://127.0.0.1:9", "models": ["m"]}],
    }
    with pytest.raises(ConfigError, match="Give one of 'replicas'"):
        parse_config(doc, "x.yaml")
    with pytest.raises(ConfigError, match=r"vllm\.count"):
        parse_config({"name": "x", "vllm": {"count": 0}}, "x.yaml")


def test_server_command_pins_and_sets_the_engine_flags() -> None:
    s = vllm.ServerSettings(served_name="m", cpus=(1,), max_num_seqs=4)
    cmd = vllm.server_command(Path("/v/bin/python"), Path("/models/t"), "127.0.0.1", 8123, s)
    assert cmd[:2] == ["/v/bin/python", "-c"] and "sched_setaffinity" in cmd[2]
    assert cmd[3] == "1"
    flags = " ".join(cmd[4:])
    for flag in (
        "--port 8123",
        "--model /models/t",
        "--served-model-name m",
        "--max-num-seqs 4",
        "--enable-prefix-caching",
        "--num-gpu-blocks-override 40",
        "--max-model-len 4096",
        "--dtype bfloat16",
    ):
        assert flag in flags
    assert "--enforce-eager" not in flags
    eager = vllm.ServerSettings(served_name="m", enforce_eager=True)
    assert "--enforce-eager" in vllm.server_command(Path("/p"), Path("/m"), "127.0.0.1", 1, eager)
    env = vllm.server_env(s)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["HF_HUB_OFFLINE"] == "1"


@pytest.fixture(scope="module")
def vllm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Endpoints, Path]]:
    if shutil.which("haproxy") is None or shutil.which("prometheus") is None:
        pytest.fail("haproxy and prometheus are needed: run scripts/setup.sh")
    if not vllm.installed():
        if os.environ.get("LBTUNE_SKIP_VLLM") == "1":
            pytest.skip(f"LBTUNE_SKIP_VLLM=1: {vllm.not_installed_message()}")
        pytest.fail(vllm.not_installed_message())
    cfg, _ = load_config("vllm-cpu")
    assert cfg.vllm is not None
    last = max(os.sched_getaffinity(0))
    one = cfg.vllm.model_copy(update={"count": 1, "cpus": [last], "enforce_eager": True})
    state = tmp_path_factory.mktemp("vllm-cluster")
    try:
        yield api.up(cfg.model_copy(update={"vllm": one}), state), state
    finally:
        api.down(state)


def _worker_starts(state: Path) -> int:
    """HAProxy's worker starts so far (a reload forks a new one): its log's lines."""
    return (state / "logs" / "haproxy.log").read_text(errors="replace").count("New worker")


@pytest.mark.integration
@pytest.mark.vllm
def test_calibrated_rates_reach_the_llm_scheduler_of_the_vllm_cluster(
    vllm_cluster: tuple[Endpoints, Path],
) -> None:
    """A vLLM replica has no GPU profile: before calibration `mode: predict` has no rates
    for it (it reads them from its metrics); after, the running HAProxy's map holds the
    measured ones at once (no reload), and an apply keeps them (its map file has them too).
    tests/conformance/test_calibrate.py checks that they predict."""
    from lbtune.apply import apply_params
    from lbtune.cluster.calibrate import calibrate, hand_to_scheduler
    from lbtune.cluster.probing import ProbePlan
    from lbtune.records.calibration import read_calibration
    from lbtune.targets.base import pool_names
    from lbtune.targets.haproxy import llm
    from lbtune.targets.haproxy.target import HaproxyTarget

    ep, state = vllm_cluster
    target = HaproxyTarget(ep)
    params = {"algorithm": "llm", "llm.mode": "predict"}
    apply_params(target, params, via="direct")
    files = llm.LlmFiles.in_dir(ep.state_dir)
    key = f"tps.{pool_names(ep.models)[MODEL]}.vllm-0"
    assert key not in llm.read_live(target.runtime, files)
    cal = calibrate(ep, plan=ProbePlan(batch=2, repeats=2))
    assert read_calibration(state) == cal
    (rates,) = cal.replicas
    want = {
        key: f"{rates.prefill_tokens_per_s:.6g}",
        key.replace("tps.", "step."): f"{rates.step_s:.6g}",
    }
    reloads = _worker_starts(state)
    assert hand_to_scheduler(ep)
    live = llm.read_live(target.runtime, files)
    assert {k: live.get(k) for k in want} == want
    assert _worker_starts(state) == reloads
    assert all(f"{k} {v}" in files.map.read_text() for k, v in want.items())
    apply_params(target, {**params, "llm.w_decode": 0.5}, via="direct")
    assert {k: llm.read_live(target.runtime, files).get(k) for k in want} == want
    apply_params(target, {"algorithm": "roundrobin"}, via="direct")
    assert not hand_to_scheduler(ep)  # no llm scheduler: the rates wait in calibration.json


@pytest.mark.integration
@pytest.mark.vllm
def test_cluster_up_serves_through_haproxy_and_down_stops_vllm(
    vllm_cluster: tuple[Endpoints, Path],
) -> None:
    ep, state = vllm_cluster
    assert [(r.name, r.gpu) for r in ep.replicas] == [("vllm-0", "cpu")]
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = 4
    resp = requests.post(ep.balancer_url + "/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1
    if ep.replica_header:
        assert resp.headers.get(ep.replica_header) == "vllm-0"
    # Prometheus scrapes vLLM's own metrics under the replica label lbtune groups by.
    query = 'vllm:num_requests_running{replica="vllm-0"}'
    found: list[object] = []
    for _ in range(100):
        r = requests.get(ep.prometheus_url + "/api/v1/query", params={"query": query}, timeout=5)
        found = r.json()["data"]["result"]
        if found:
            break
        time.sleep(0.1)
    assert found, f"Prometheus has no {query}"
    status = api.status(state)
    assert status.healthy, status.problems
    pids = [c.pid for c in status.components if c.name == "vllm-0" and c.pid is not None]
    assert pids
    family = [pids[0], *(p.pid for p in psutil.Process(pids[0]).children(recursive=True))]
    assert psutil.Process(pids[0]).cpu_affinity() == [max(os.sched_getaffinity(0))]
    assert "--enforce-eager" in psutil.Process(pids[0]).cmdline()  # the section's flag reached it
    stopped = api.down(state)
    assert "vllm-0" in stopped
    assert not [
        p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
    ]
