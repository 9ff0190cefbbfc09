"""The rig of the LLM scheduler's benchmarks (``llm_pick_cost.py``, ``llm_reloads.py``).

Three fake replicas are frontends of a second HAProxy (``/metrics`` answers fixed vLLM
gauges, everything else a small JSON 200), so the replicas cost next to nothing; the
balancer is the HAProxy target's own config and apply path. :func:`llm_rig` starts both
in a fresh state dir, waits until the balancer sees every replica, and tears it all down.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.targets.haproxy import config
from lbtune.targets.haproxy.balancer import servers_missing
from lbtune.targets.haproxy.files import HaproxyFiles, Site
from lbtune.targets.haproxy.target import HaproxyTarget

M8 = "llama-3.1-8b-instruct"
GPUS = [("h100-0", "h100-80g"), ("a100-0", "a100-80g"), ("l4-0", "l4-24g")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replicas_cfg(ports: list[int]) -> str:
    metrics = (
        'vllm:num_requests_waiting{model_name=\\"m\\"} 1\\n'
        'vllm:kv_cache_usage_perc{model_name=\\"m\\"} 0.2\\n'
    )
    lines = ["defaults", "    mode http", "    timeout client 10s", "    timeout connect 1s"]
    for i, p in enumerate(ports):
        lines += [
            f"frontend r{i}",
            f"    bind 127.0.0.1:{p}",
            f'    http-request return status 200 content-type text/plain string "{metrics}" '
            "if { path /metrics }",
            "    http-request return status 200 content-type application/json string '{\"ok\":1}'",
        ]
    return "\n".join(lines) + "\n"


def endpoints(state: Path, ports: list[int], lb: int, stats: int) -> Endpoints:
    return Endpoints(
        config_name="bench",
        config_path="-",
        state_dir=str(state),
        balancer="haproxy",
        balancer_url=f"http://127.0.0.1:{lb}",
        stats_url=f"http://127.0.0.1:{stats}/stats",
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


def bodies(n: int, seed: int = 1) -> list[bytes]:
    """``n`` chat requests: ~2 KB prompts over 20 shared prefixes, 16 tokens answered."""
    rng = random.Random(seed)
    prefixes = [" ".join(f"p{k}w{i}" for i in range(250)) for k in range(20)]
    out = []
    for i in range(n):
        content = rng.choice(prefixes) + f" question {i} " + "x" * rng.randint(0, 400)
        doc = {"model": M8, "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
        out.append(json.dumps(doc).encode())
    return out


@dataclass(frozen=True)
class Rig:
    """The rig, up: the balancer answers on ``lb`` (its stats page on ``stats``)."""

    target: HaproxyTarget
    lb: int
    stats: int
    balancer: subprocess.Popen[bytes]
    """The balancer's master process (``-W``): alive while it has survived."""
    log_path: Path
    """Both HAProxies' output."""


@contextmanager
def llm_rig(prefix: str) -> Iterator[Rig]:
    """The fake replicas and the untuned balancer in a state dir under /tmp named with
    ``prefix``, up (or exit with the log after 20 s); stopped and removed on exit."""
    binary = shutil.which("haproxy")
    if binary is None:
        sys.exit("haproxy is needed")
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    (state / "logs").mkdir()
    ports = [free_port() for _ in GPUS]
    (state / "replicas.cfg").write_text(replicas_cfg(ports))
    lb, stats = free_port(), free_port()
    ep = endpoints(state, ports, lb, stats)
    files = HaproxyFiles.in_dir(state)
    files.cfg.write_text(config.render_untuned(Site.from_endpoints(ep)))
    log_path = state / "logs" / "haproxy.log"
    log = log_path.open("w")
    procs = [
        subprocess.Popen([binary, "-f", str(state / "replicas.cfg")], stdout=log, stderr=log),
        subprocess.Popen(
            [binary, "-W", "-S", files.master_socket, "-f", str(files.cfg)], stdout=log, stderr=log
        ),
    ]
    try:
        target = HaproxyTarget(ep)
        deadline = time.monotonic() + 20
        while servers_missing(target.runtime, [n for n, _ in GPUS], ep.balancer_url):
            if time.monotonic() > deadline:
                sys.exit("HAProxy did not come up: " + log_path.read_text())
            time.sleep(0.05)
        yield Rig(target, lb, stats, procs[1], log_path)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        log.close()
        shutil.rmtree(state, ignore_errors=True)
