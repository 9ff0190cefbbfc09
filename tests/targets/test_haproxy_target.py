"""The HAProxy target on a real mini2 cluster (direct path), plus pure config checks."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.targets.base import RejectedBeforeApply
from lbtune.targets.haproxy import config
from lbtune.targets.haproxy.files import HaproxyFiles, Site
from lbtune.targets.haproxy.target import HaproxyTarget

M8 = "llama-3.1-8b-instruct"


def fake_endpoints(state: Path) -> Endpoints:
    return Endpoints(
        config_name="t",
        config_path="-",
        state_dir=str(state),
        balancer="haproxy",
        balancer_url="http://127.0.0.1:18000",
        stats_url="http://127.0.0.1:18404/stats",
        balancer_metrics_url="-",
        balancer_components=["haproxy"],
        balancer_jobs=["haproxy"],
        balancer_details=HaproxyFiles.in_dir(state).details(),
        replica_header="X-Lbtune-Replica",
        prometheus_url="http://127.0.0.1:19490",
        exporter_port=1,
        exporter_url="-",
        prometheus_yml="-",
        replicas=[
            ReplicaEndpoint(name=n, url=f"http://127.0.0.1:{18100 + i}", models=[M8], gpu=g)
            for i, (n, g) in enumerate(
                [("h100-0", "h100-80g"), ("a100-0", "a100-80g"), ("l4-0", "l4-24g")]
            )
        ],
        time_scale=1.0,
        ground_truth_path=None,
    )


def test_live_vs_structural_knobs() -> None:
    assert config.kind_of("weight.h100-0", {"algorithm": "hash"}) == "live"
    assert config.kind_of("weight.h100-0", {"algorithm": "static-rr"}) == "structural"
    assert config.kind_of("maxconn.h100-0", {}) == "live"
    assert config.kind_of("algorithm", {}) == "structural"
    assert config.kind_of("agent.a", {}) == "agent"


def test_long_context_set_is_the_largest_memory_gpus(tmp_path: Path) -> None:
    assert config.long_context_servers(Site.from_endpoints(fake_endpoints(tmp_path))) == [
        "h100-0",
        "a100-0",
    ]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")
@pytest.mark.parametrize("algorithm", ["roundrobin", "leastconn", "random", "hash"])
def test_every_algorithm_renders_a_config_haproxy_accepts(tmp_path: Path, algorithm: str) -> None:
    target = HaproxyTarget(fake_endpoints(tmp_path))
    params = target.space().complete(
        {"algorithm": algorithm, "long_request_bytes": 8192, "maxconn.l4-0": 4, "weight.l4-0": 7},
        {},
    )
    text = config.render_config(target.site, params)
    if algorithm == "hash":
        assert "balance hash var(txn.lbtune_prompt),bytes(0,256)" in text
        assert "hash-type consistent" in text and "hash-balance-factor 150" in text
        assert "json_query('$.messages[0].content')" in text
    if algorithm == "random":
        assert "balance random(2)" in text
    assert "backend long_model_llama-3.1-8b-instruct" in text
    long_be = text.split("\nbackend long_model_")[1]
    assert "server h100-0" in long_be and "server a100-0" in long_be and "l4-0" not in long_be
    assert "server l4-0 127.0.0.1:18102 check weight 7 maxconn 4" in text
    target._validate(text)  # haproxy -c -q


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")
@pytest.mark.parametrize("end", ["low", "high"])
def test_haproxy_accepts_both_ends_of_every_knobs_range(tmp_path: Path, end: str) -> None:
    """The space promises nothing HAProxy refuses (hash-balance-factor: 0 or > 100)."""
    target = HaproxyTarget(fake_endpoints(tmp_path))
    space = target.space()
    for algorithm in ("roundrobin", "hash", "random"):
        edge = {
            name: int(getattr(spec, end)) if spec.type == "int" else float(getattr(spec, end))
            for name, spec in space.params.items()
            if spec.type in ("int", "float") and not name.startswith(config.AGENT_PREFIX)
        }
        params = space.complete(space.validate({**edge, "algorithm": algorithm}), {})
        target._validate(config.render_config(target.site, params))


# ------------------------------------------------------------------------------------------
# Integration: one mini2 cluster for the module.


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaproxyTarget]:
    if shutil.which("haproxy") is None or shutil.which("prometheus") is None:
        pytest.skip("haproxy and prometheus are needed")
    state = tmp_path_factory.mktemp("hap")
    try:
        ep = api.up(load_config("mini2")[0], state)
        yield HaproxyTarget(ep)
    finally:
        api.down(state)


@pytest.fixture
def baseline(target: HaproxyTarget) -> Iterator[HaproxyTarget]:
    target.apply(target.space().baseline())
    yield target
    target.template_overrides = {}


def chat(target: HaproxyTarget, content: str = "hi") -> requests.Response:
    body: dict[str, Any] = {
        "model": M8,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": content}],
    }
    return requests.post(
        f"{target.endpoints.balancer_url}/v1/chat/completions", json=body, timeout=30
    )


@pytest.mark.integration
def test_weights_and_maxconn_change_live_without_a_reload(baseline: HaproxyTarget) -> None:
    t = baseline
    reloads, pid = t.reload_count(), t.worker_pid()
    result = t.apply({"weight.h100-0": 40, "maxconn.l4-0": 3})
    assert result.changed and not result.reloaded
    assert result.diff == {"weight.h100-0": (100, 40), "maxconn.l4-0": (0, 3)}
    for be in ("all", "model_llama-3.1-8b-instruct", "model_llama-3.1-70b-instruct-awq"):
        assert t.runtime.get_weight(be, "h100-0") == 40
    assert t.reload_count() == reloads and t.worker_pid() == pid
    assert "server h100-0 127.0.0.1" in t.cfg_path.read_text()
    assert " weight 40" in t.cfg_path.read_text()  # one source of truth
    again = t.apply({"weight.h100-0": 40, "maxconn.l4-0": 3})
    assert not again.changed and again.diff == {}


@pytest.mark.integration
def test_check_mode_shows_the_diff_and_changes_nothing(baseline: HaproxyTarget) -> None:
    t = baseline
    cfg_before = t.cfg_path.read_text()
    result = t.apply({"weight.l4-0": 9, "algorithm": "leastconn"}, check=True)
    assert result.check and result.changed and result.reloaded
    assert result.diff == {"weight.l4-0": (100, 9), "algorithm": ("roundrobin", "leastconn")}
    assert t.runtime.get_weight("all", "l4-0") == 100
    assert t.cfg_path.read_text() == cfg_before


@pytest.mark.integration
def test_invalid_params_are_refused_before_anything_is_touched(baseline: HaproxyTarget) -> None:
    t = baseline
    before = t.read_live()
    with pytest.raises(
        ConfigError, match=r"weight.l4-0: 999 is out of range; expected an integer in 0..256"
    ):
        t.apply({"weight.h100-0": 5, "weight.l4-0": 999})
    assert t.read_live() == before


@pytest.mark.integration
def test_algorithm_switch_reloads_keeps_weights_and_traffic_flows(baseline: HaproxyTarget) -> None:
    t = baseline
    t.apply({"weight.l4-0": 60})
    reloads = t.reload_count()
    result = t.apply({"algorithm": "hash", "hash_bytes": 64})
    assert result.reloaded and t.reload_count() == reloads + 1
    assert t.runtime.get_weight("all", "l4-0") == 60  # survived the reload
    served = {chat(t, "same prompt").headers.get("X-Lbtune-Replica") for _ in range(6)}
    assert len(served) == 1  # consistent hashing on the prompt
    t.apply({"algorithm": "leastconn"})
    assert t.reload_count() == reloads + 2
    assert "balance leastconn" in t.cfg_path.read_text()
    assert chat(t).status_code == 200


@pytest.mark.integration
def test_long_requests_go_to_the_long_context_servers(baseline: HaproxyTarget) -> None:
    t = baseline
    t.apply({"long_request_bytes": 4096})
    served = {chat(t, "word " * 2000).headers.get("X-Lbtune-Replica") for _ in range(4)}
    assert served == {"h100-0"}
    short = {chat(t).headers.get("X-Lbtune-Replica") for _ in range(4)}
    assert short == {"h100-0", "l4-0"}


@pytest.mark.integration
def test_a_rejected_config_keeps_haproxy_serving_without_dropping_requests(
    baseline: HaproxyTarget,
) -> None:
    t = baseline
    cfg_before = t.cfg_path.read_text()
    pid, live_before = t.worker_pid(), t.read_live()
    t.template_overrides = {"haproxy_timeout_queue": "bogus"}
    codes: list[int] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set() and len(codes) < 200:
            try:
                codes.append(chat(t).status_code)
            except requests.RequestException:
                codes.append(-1)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        with pytest.raises(RejectedBeforeApply, match="HAProxy rejects the new config") as exc:
            t.apply({"algorithm": "leastconn"})
        for _ in range(3):
            codes.append(chat(t).status_code)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert "timeout" in str(exc.value)
    assert t.cfg_path.read_text() == cfg_before
    assert t.worker_pid() == pid and t.read_live() == live_before
    assert codes and [c for c in codes if not 200 <= c < 300] == []


def test_removing_backends_by_reload_then_setting_weights_is_not_raced(
    baseline: HaproxyTarget,
) -> None:
    """Length routing on/off adds and removes backends; the runtime weights that follow a
    reload must go to the new worker's backends, never to the old worker's (a resumed study
    once failed with "No such backend")."""
    t = baseline
    for i in range(4):
        t.apply({"long_request_bytes": 4096, "weight.h100-0": 50 + i})
        t.apply({"long_request_bytes": 0, "weight.h100-0": 60 + i})
        assert t.read_live()["weight.h100-0"] == 60 + i


def test_agent_knobs_are_fixed_when_no_agent_runs(target: HaproxyTarget) -> None:
    """Searching knobs nobody acts on is noise: without an agent, agent.* are fixed."""
    assert target.endpoints.agent_config is None
    space = target.space()
    agent_knobs = [n for n in space.params if n.startswith("agent.")]
    assert agent_knobs and all(space.params[n].fixed for n in agent_knobs)
    assert not space.params["weight.l4-0"].fixed
