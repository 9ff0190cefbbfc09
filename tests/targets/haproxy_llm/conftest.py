"""A real HAProxy (the target's own config and apply path) in front of three fake replicas."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.targets.haproxy import config
from lbtune.targets.haproxy.balancer import servers_missing
from lbtune.targets.haproxy.files import HaproxyFiles, Site
from lbtune.targets.haproxy.target import HaproxyTarget
from tests.targets.haproxy_fixture import free_port
from tests.targets.haproxy_llm.fake_replica import FakeReplica

M8 = "llama-3.1-8b-instruct"
GPUS = [("h100-0", "h100-80g"), ("a100-0", "a100-80g"), ("l4-0", "l4-24g")]


def endpoints(state: Path, ports: list[int], lb_port: int, stats_port: int) -> Endpoints:
    return Endpoints(
        config_name="t",
        config_path="-",
        state_dir=str(state),
        balancer="haproxy",
        balancer_url=f"http://127.0.0.1:{lb_port}",
        stats_url=f"http://127.0.0.1:{stats_port}/stats",
        balancer_metrics_url="-",
        balancer_components=["haproxy"],
        balancer_jobs=["haproxy"],
        balancer_details=HaproxyFiles.in_dir(state).details(),
        replica_header="X-Lbtune-Replica",
        prometheus_url="http://127.0.0.1:1",
        exporter_port=1,
        exporter_url="-",
        prometheus_yml="-",
        replicas=[
            ReplicaEndpoint(name=n, url=f"http://127.0.0.1:{p}", models=[M8], gpu=g)
            for (n, g), p in zip(GPUS, ports, strict=True)
        ],
        time_scale=1.0,
        ground_truth_path=None,
    )


@dataclass
class Cluster:
    target: HaproxyTarget
    replicas: dict[str, FakeReplica]
    url: str
    stats: str

    def chat(
        self, content: str, headers: dict[str, str] | None = None, body: str | None = None
    ) -> requests.Response:
        msg = {"model": M8, "messages": [{"role": "user", "content": content}]}
        data = body or json.dumps(msg)
        return requests.post(
            self.url + "/v1/chat/completions",
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=30,
        )

    def metrics(self) -> dict[str, float]:
        text = requests.get(self.stats + "/llm/metrics", timeout=5).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_metric(self, key: str, ok: object, timeout_s: float = 30.0) -> dict[str, float]:
        """Poll the scheduler's counters until ``ok(value)`` (readiness, not a sleep)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            if key in m and ok(m[key]):  # type: ignore[operator]
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{key} never satisfied the condition: {m.get(key)}")
            time.sleep(0.05)

    def start_llm(self, knobs: Mapping[str, object]) -> None:
        """The scheduler applied with ``knobs``, every replica empty and its metrics fresh
        (the scrape that shows them empty has happened)."""
        for r in self.replicas.values():
            r.metrics_ok, r.kv, r.waiting, r.running, r.delay_s = True, 0.0, 0.0, 0.0, 0.0
        self.target.apply({"algorithm": "llm", **knobs})
        self.set_kv({n: 0.0 for n in self.replicas})

    def set_kv(self, usage: dict[str, float]) -> None:
        for name, kv in usage.items():
            self.replicas[name].kv = kv
        for name, kv in usage.items():
            self.wait_metric(
                f'lbtune_llm_kv_usage{{server="{name}"}}', lambda v, k=kv: abs(v - k) < 1e-3
            )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is needed (sudo apt-get install haproxy)")
    state = Path(tempfile.mkdtemp(prefix="lbt-llm-", dir="/tmp"))
    fakes = {n: FakeReplica(n, M8) for n, _ in GPUS}
    lb, stats = free_port(), free_port()
    ep = endpoints(state, [f.port for f in fakes.values()], lb, stats)
    (state / "logs").mkdir()
    files = HaproxyFiles.in_dir(state)
    files.cfg.write_text(config.render_untuned(Site.from_endpoints(ep)), encoding="utf-8")
    log = (state / "logs" / "haproxy.log").open("w")
    proc = subprocess.Popen(
        [binary, "-W", "-S", files.master_socket, "-f", str(files.cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    target = HaproxyTarget(ep)
    try:
        deadline = time.monotonic() + 20
        while servers_missing(target.runtime, list(fakes), ep.balancer_url) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((state / "logs" / "haproxy.log").read_text())
            time.sleep(0.05)
        yield Cluster(target, fakes, ep.balancer_url, f"http://127.0.0.1:{stats}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        for f in fakes.values():
            f.close()
        shutil.rmtree(state, ignore_errors=True)
