"""Fixtures for the cluster tests: one real mini2 cluster (sim + HAProxy + Prometheus) per
module on free loopback ports, in a temporary state dir, always torn down."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.cluster.resolve import free_port
from lbtune.process import probes
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"
SIM_SCALE = 4.0
"""The time scale of :func:`l4_replica`."""

needs_binaries = pytest.mark.skipif(
    shutil.which("haproxy") is None or shutil.which("prometheus") is None,
    reason="haproxy and prometheus are needed (sudo apt-get install haproxy prometheus)",
)


def mini_config(time_scale: float = 4.0) -> Any:
    """The mini2 preset (ports: auto) with another time scale."""
    cfg, _ = load_config("mini2")
    return cfg.model_copy(update={"time_scale": time_scale})


def started_pids(state_dir: Path) -> list[int]:
    """Every PID the cluster in ``state_dir`` runs, children (HAProxy workers) included."""
    pids: list[int] = []
    for pid_file in state_dir.glob("*.pid"):
        pid = json.loads(pid_file.read_text())["pid"]
        pids.append(pid)
        with contextlib.suppress(psutil.Error):
            pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return pids


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """A running mini2 cluster (h100-0 serves 8B + 70B, l4-0 serves 8B)."""
    if shutil.which("haproxy") is None or shutil.which("prometheus") is None:
        pytest.skip("haproxy and prometheus are needed")
    state = tmp_path_factory.mktemp("mini2")
    try:
        yield api.up(mini_config(), state)
    finally:
        api.down(state)


def chat(
    base: str, model: str, *, stream: bool = False, max_tokens: int = 4, content: str = "hi"
) -> requests.Response:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return requests.post(f"{base}/v1/chat/completions", json=body, stream=stream, timeout=30)


def stream_ttft(base: str, model: str, max_tokens: int = 24) -> tuple[float, float, int]:
    """(time to first content chunk, total time, number of content chunks) of one stream."""
    t0 = time.perf_counter()
    resp = chat(base, model, stream=True, max_tokens=max_tokens, content="tell me a story")
    resp.raise_for_status()
    first: float | None = None
    chunks = 0
    buf = b""
    for data in resp.iter_content(chunk_size=None):
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                continue
            choices = json.loads(payload).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    assert first is not None, "no content chunk"
    return first, total, chunks


@pytest.fixture(scope="module")
def l4_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaEndpoint]:
    """One simulated L4 (time scale :data:`SIM_SCALE`) in its own process, as a real
    replica would be."""
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lbtune.sim", "--replica", f"l4-0:{port}:l4-24g:{M8}",
             "--time-scale", str(SIM_SCALE)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not probes.healthy(url) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert probes.healthy(url), log.read_text()
        yield ReplicaEndpoint(name="l4-0", url=url, models=[M8], gpu="l4-24g")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
