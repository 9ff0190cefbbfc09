"""The embedded cluster with vllm-router as its balancer (``balancer: vllm-router``).

One two-replica cluster (h100-0 and l4-0, both serving the 8B model) behind a real
vllm-router and a real Prometheus serves the module; the last test brings it down.
"""

from __future__ import annotations

import collections
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.cluster import api
from lbtune.cluster.config import ClusterConfig, ReplicaGroup, load_config, parse_config
from lbtune.errors import ConfigError
from lbtune.process import probes
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.targets.vllm_router import process as router
from tests.cluster.conftest import M8, M70, alive, started_pids

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is needed"),
]


def router_config() -> ClusterConfig:
    """mini2 with both replicas serving the 8B model, behind vllm-router."""
    cfg, _ = load_config("mini2")
    groups = [ReplicaGroup(gpu="h100-80g", models=[M8]), ReplicaGroup(gpu="l4-24g", models=[M8])]
    return cfg.model_copy(
        update={"name": "mini2-router", "balancer": "vllm-router", "replicas": groups}
    )


@pytest.fixture(scope="module")
def rcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    state = tmp_path_factory.mktemp("router")
    try:
        yield api.up(router_config(), state)
    finally:
        api.down(state)


def test_mixed_models_are_refused_behind_the_router() -> None:
    cfg, _ = load_config("mini2")  # h100 serves 8B + 70B, l4 only the 8B
    data = {**cfg.model_dump(mode="json"), "balancer": "vllm-router"}
    with pytest.raises(ConfigError, match="vllm-router does not route by model"):
        parse_config(data, "x.yaml")
    assert load_config("hetero4-router")[0].balancer == "vllm-router"
    assert M70 not in {m for g in load_config("hetero4-router")[0].replicas for m in g.models}


def test_the_router_runs_and_prometheus_scrapes_it(rcluster: Endpoints) -> None:
    state = Path(rcluster.state_dir)
    _, command = router.live_command(StatePaths(state))
    assert command.url == rcluster.balancer_url
    assert command.params["policy"] == "cache_aware"
    assert sorted(command.worker_urls) == sorted(r.url for r in rcluster.replicas)
    assert not (state / "haproxy.pid").exists()
    metrics = requests.get(rcluster.balancer_metrics_url, timeout=5).text
    assert "vllm_router_active_workers 2" in metrics
    status = api.status(state)
    assert status.healthy, status.problems
    assert {c.name for c in status.components} == {"sim", "router", "prometheus", "keeper"}


def test_a_streaming_chat_goes_through_the_router(rcluster: Endpoints) -> None:
    body: dict[str, Any] = {
        "model": M8,
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    resp = requests.post(
        f"{rcluster.balancer_url}/v1/chat/completions", json=body, stream=True, timeout=30
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["x-sim-replica"] in {"h100-0", "l4-0"}
    first: float | None = None
    events: list[bytes] = []
    buf = b""
    for data in resp.iter_content(chunk_size=None):
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            events.append(event.removeprefix(b"data: "))
            if first is None and b'"content":"' in event and b'"content":""' not in event:
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 16
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert first is not None and total - first > 0.01  # chunk by chunk, not buffered


def test_cache_aware_keeps_a_shared_prefix_on_one_replica(rcluster: Endpoints) -> None:
    seen: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for turn in range(4):
        for group in range(3):
            system = f"You are assistant number {group}. " + "Answer briefly and kindly. " * 60
            body: dict[str, Any] = {
                "model": M8,
                "max_tokens": 2,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {turn}"},
                ],
            }
            resp = requests.post(
                f"{rcluster.balancer_url}/v1/chat/completions", json=body, timeout=30
            )
            assert resp.status_code == 200, resp.text
            seen[group][resp.headers["x-sim-replica"]] += 1
    assert all(len(replicas) == 1 for replicas in seen.values()), dict(seen)


def test_down_stops_the_router(rcluster: Endpoints) -> None:
    state = Path(rcluster.state_dir)
    pids = started_pids(state)
    stopped = api.down(state)
    assert "router" in stopped
    assert sorted(p for ps in stopped.values() for p in ps) == sorted(pids)
    assert not [p for p in pids if alive(p)]
    assert not probes.port_busy("127.0.0.1", int(rcluster.balancer_url.rsplit(":", 1)[1]))
