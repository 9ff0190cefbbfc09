"""The vllm-router target: command lines, the sim's worker endpoints, apply/read-back/rollback.

The pure parts run without processes; the sim's router endpoints run in an in-process
sim host; the target runs against one embedded cluster behind a real vllm-router, directly
and through lbtune.apply's Ansible path (lbtune/data/playbooks/target-apply.yml +
lbtune_vllm_router).
"""

from __future__ import annotations

import collections
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from lbtune.apply import apply_params, rollback
from lbtune.cluster import api
from lbtune.cluster.resolve import free_port
from lbtune.errors import ApplyError, ClusterError, ConfigError
from lbtune.process.supervisor import read_record, stop
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.sim.host import HostThread
from lbtune.sim.router_api import add_router_routes
from lbtune.sim.spec import HostSpec, ReplicaSpec
from lbtune.targets import get_target
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import TargetBase
from lbtune.targets.vllm_router import process as router
from lbtune.targets.vllm_router.target import SPACE_FILE, VllmRouterTarget
from tests.cluster.test_router_cluster import router_config

M8 = "llama-3.1-8b-instruct"

# --- pure -------------------------------------------------------------------------------


def test_the_command_line_round_trips() -> None:
    params = router.active({"policy": "power_of_two", "cache_threshold": 0.5})
    cmd = router.RouterCommand(
        params, ("http://127.0.0.1:1", "http://127.0.0.1:2"), "127.0.0.1", 9, 10
    )
    argv = cmd.argv()
    assert argv[:3] == [sys.executable, "-m", "lbtune.targets.vllm_router.process"]
    assert argv[argv.index("--policy") + 1] == "power_of_two"
    assert argv[argv.index("--cache-threshold") + 1] == "0.5"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert router.parse_argv(argv) == cmd


def test_unknown_knobs_and_policies_are_refused() -> None:
    with pytest.raises(ClusterError, match=r"Unknown vllm-router policy 'fastest'\. Available"):
        router.active({"policy": "fastest"})
    with pytest.raises(ClusterError, match="Unknown vllm-router knob"):
        router.active({"cache_treshold": 0.1})


def test_the_space_baseline_is_the_routers_own_defaults() -> None:
    s = ParameterSpace.load(SPACE_FILE)
    assert s.baseline() == router.DEFAULTS
    assert not s.is_active("cache_threshold", {"policy": "round_robin"})
    with pytest.raises(
        ConfigError, match=r"cache_threshold: 1.5 is out of range; expected a number in 0..1"
    ):
        s.validate({"cache_threshold": 1.5})


# --- the sim's worker endpoints -----------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[HostThread]:
    spec = HostSpec(
        time_scale=20,
        replicas=[
            ReplicaSpec(name=f"r{i}", port=free_port(), gpu="h100-80g", models=[M8], startup_s=0)
            for i in range(3)
        ],
    )
    host = HostThread(spec)
    for replica in host.host.replicas:
        add_router_routes(replica.app, replica)
    host.start()
    try:
        yield host
    finally:
        host.stop()


def test_tokenize_answers_in_vllms_format(sim: HostThread) -> None:
    url = sim.urls["r0"]
    out = requests.post(f"{url}/tokenize", json={"model": M8, "prompt": "hello, world"}, timeout=5)
    data = out.json()
    assert set(data) == {"count", "max_model_len", "tokens", "token_strs"}
    assert data["count"] == 3 == len(data["tokens"]) and data["max_model_len"] == 131072
    chat: dict[str, Any] = {
        "model": M8,
        "messages": [{"role": "user", "content": "hi"}],
        "return_token_strs": True,
    }
    data = requests.post(f"{url}/tokenize", json=chat, timeout=5).json()
    assert data["token_strs"][:3] == ["<", "|", "user"]
    assert (
        requests.post(
            f"{url}/tokenize", json={"model": "gpt-4o", "prompt": "x"}, timeout=5
        ).status_code
        == 404
    )
    assert requests.post(f"{url}/tokenize", data=b"{", timeout=5).status_code == 400


def test_render_answers_generate_requests(sim: HostThread) -> None:
    url = sim.urls["r0"]
    body: dict[str, Any] = {
        "model": M8,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 7,
    }
    chat = requests.post(f"{url}/v1/chat/completions/render", json=body, timeout=5).json()
    tok = requests.post(f"{url}/tokenize", json=body, timeout=5).json()
    assert chat["request_id"].startswith("chatcmpl-") and chat["model"] == M8
    assert chat["token_ids"] == tok["tokens"] and chat["sampling_params"]["max_tokens"] == 7
    assert {"features", "stream", "cache_salt", "priority", "kv_transfer_params"} <= set(chat)
    comp = requests.post(
        f"{url}/v1/completions/render", json={"model": M8, "prompt": ["a b", "c"]}, timeout=5
    ).json()
    assert [len(c["token_ids"]) for c in comp] == [2, 1]
    assert all(c["request_id"].startswith("cmpl-") for c in comp)


def test_get_load_counts_requests_on_the_replica(sim: HostThread) -> None:
    data = requests.get(f"{sim.urls['r1']}/get_load", timeout=5).json()
    assert data == {
        "load": 0,
        "num_requests_running": 0,
        "num_requests_waiting": 0,
        "kv_cache_usage_perc": 0.0,
    }


def test_a_router_on_the_endpoints_keeps_prefixes_together(sim: HostThread, tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.create()
    params = router.active({"policy": "cache_aware"})
    cmd = router.RouterCommand(
        params, tuple(sim.urls.values()), "127.0.0.1", free_port(), free_port()
    )
    rec = router.start(paths, cmd)
    try:
        seen: dict[int, set[str]] = collections.defaultdict(set)
        for turn in range(3):
            for group in range(3):
                system = f"Assistant {group}. " + "Be brief. " * 80
                msgs = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": str(turn)},
                ]
                resp = requests.post(
                    f"{cmd.url}/v1/chat/completions",
                    json={"model": M8, "max_tokens": 2, "messages": msgs},
                    timeout=10,
                )
                assert resp.status_code == 200
                seen[group].add(resp.headers["x-sim-replica"])
        assert all(len(s) == 1 for s in seen.values()), dict(seen)
    finally:
        stop(rec, paths)


# --- the target on an embedded cluster ----------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is needed")
    state = tmp_path_factory.mktemp("vr")
    try:
        yield api.up(router_config(), state)
    finally:
        api.down(state)


def _pid(ep: Endpoints) -> int:
    rec = read_record(StatePaths(Path(ep.state_dir)), "router")
    assert rec is not None
    return rec.pid


@pytest.mark.integration
def test_apply_restarts_with_the_new_policy_and_reads_it_back(cluster: Endpoints) -> None:
    target = get_target("vllm-router", cluster)
    assert isinstance(target, VllmRouterTarget)
    assert target.read_live() == router.DEFAULTS
    before = _pid(cluster)
    result = target.apply({"policy": "round_robin"})
    assert result.changed and result.reloaded
    assert result.diff == {"policy": ("cache_aware", "round_robin")}
    assert result.applied == {**router.DEFAULTS, "policy": "round_robin"}
    after = _pid(cluster)
    assert after != before
    cmdline = psutil.Process(after).cmdline()
    assert cmdline[cmdline.index("--policy") + 1] == "round_robin"
    assert target.last_downtime_s is not None and target.last_downtime_s < 5
    seen = {chat_replica(cluster) for _ in range(4)}
    assert seen == {"h100-0", "l4-0"}  # round robin over both
    again = target.apply({"policy": "round_robin"})
    assert not again.changed and _pid(cluster) == after


def chat_replica(ep: Endpoints) -> str:
    body: dict[str, Any] = {
        "model": M8,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "same"}],
    }
    resp = requests.post(f"{ep.balancer_url}/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200
    return str(resp.headers["x-sim-replica"])


@pytest.mark.integration
def test_check_mode_and_bad_values_touch_nothing(cluster: Endpoints) -> None:
    target = VllmRouterTarget(cluster)
    pid = _pid(cluster)
    live = target.read_live()
    result = target.apply({"policy": "power_of_two"}, check=True)
    assert result.check and result.changed and result.diff["policy"][1] == "power_of_two"
    with pytest.raises(ConfigError, match="policy: got 'fastest'; expected one of round_robin"):
        target.apply({"policy": "fastest"})
    with pytest.raises(ConfigError, match="unknown knob"):
        target.apply({"cache_treshold": 0.2})
    assert _pid(cluster) == pid and target.read_live() == live


@pytest.mark.integration
def test_rollback_restores_the_last_known_good(cluster: Endpoints) -> None:
    target = VllmRouterTarget(cluster)
    good = target.apply({"policy": "cache_aware", "cache_threshold": 0.5}).applied
    LkgStore(cluster.state_dir, "vllm-router").record(good, "test")
    target.apply({"policy": "consistent_hash"})
    assert target.read_live()["policy"] == "consistent_hash"
    result = target.rollback()
    assert result.changed and target.read_live() == good


def _fresh(cluster: Endpoints) -> VllmRouterTarget:
    """The router on its defaults, with no last known good recorded."""
    target = VllmRouterTarget(cluster)
    target.apply(router.DEFAULTS)
    shutil.rmtree(target.state_dir / "lkg", ignore_errors=True)
    return target


@pytest.mark.integration
def test_it_is_a_target_with_a_state_dir(cluster: Endpoints) -> None:
    target = VllmRouterTarget(cluster)
    assert isinstance(target, TargetBase)
    assert target.state_dir == Path(cluster.state_dir)


@pytest.mark.integration
def test_ansible_check_mode_shows_the_diff_and_touches_nothing(
    cluster: Endpoints, tmp_path: Path
) -> None:
    target = _fresh(cluster)
    pid = _pid(cluster)
    out = apply_params(target, {"policy": "random"}, via="ansible", check=True, source="t")
    assert out.result.check and out.result.changed and out.result.reloaded
    assert out.result.diff == {"policy": ("cache_aware", "random")}
    assert [h.line() for h in out.hosts] == ["localhost: changed (1 knobs, reloaded)"]
    assert out.log_path is not None
    logged = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", out.log_path.read_text()).split())
    assert "--- before: live +++ after: requested" in logged  # --diff, as for every target
    assert "-policy: cache_aware +policy: random" in logged
    assert _pid(cluster) == pid and target.read_live() == router.DEFAULTS
    assert LkgStore(target.state_dir, target.name).get() is None
    with pytest.raises(
        ApplyError,
        match=r"FAILED at task 'Apply parameters': "
        r"TargetError: No lbtune-managed balancer in",
    ):
        apply_params(
            target,
            {"policy": "random"},
            via="ansible",
            check=True,
            extravars={"lbtune_state_dir": str(tmp_path)},
        )


@pytest.mark.integration
def test_ansible_apply_is_idempotent_and_rollback_restores(cluster: Endpoints) -> None:
    target = _fresh(cluster)
    pid = _pid(cluster)
    done = apply_params(target, {"policy": "random"}, via="ansible", source="file:r.yaml")
    assert done.result.changed and done.result.reloaded
    assert done.result.applied == {**router.DEFAULTS, "policy": "random"} == target.read_live()
    assert [h.line() for h in done.hosts] == ["localhost: changed (1 knobs, reloaded)"]
    assert _pid(cluster) != pid
    history = LkgStore(target.state_dir, target.name).history()
    assert [h.source for h in history] == ["baseline (live before the first apply)", "file:r.yaml"]
    pid = _pid(cluster)
    again = apply_params(target, {"policy": "random"}, via="ansible", source="file:r.yaml")
    assert not again.result.changed and again.result.diff == {}
    assert [h.status for h in again.hosts] == ["ok"] and _pid(cluster) == pid
    target.apply({"policy": "round_robin"})  # drift outside lbtune's record
    back = rollback(target)
    assert back.result.changed and target.read_live() == done.result.applied


@pytest.mark.integration
def test_a_playbook_failing_after_the_restart_rolls_back(cluster: Endpoints) -> None:
    target = VllmRouterTarget(cluster)
    apply_params(target, {"policy": "power_of_two"}, via="direct", source="good")
    with pytest.raises(
        ApplyError,
        match=r"FAILED at task 'Injected failure.*rolled back to the last known good .* from good",
    ):
        apply_params(
            target,
            {"policy": "consistent_hash"},
            via="ansible",
            extravars={"lbtune_fail_after_apply": True},
        )
    assert target.read_live() == {**router.DEFAULTS, "policy": "power_of_two"}
