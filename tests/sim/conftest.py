"""Shared fixtures for the sim server tests: in-process replicas on free loopback ports."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lbtune.cluster.resolve import free_port as free_port
from lbtune.sim.host import HostThread, run_in_thread
from lbtune.sim.spec import HostSpec, ReplicaSpec

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"
TIME_SCALE = 40.0


def make_spec(time_scale: float = TIME_SCALE, seed: int = 0, **replicas: Any) -> HostSpec:
    """A HostSpec with one replica per keyword: ``name=(gpu, [models], {extra fields})``."""
    reps = [
        ReplicaSpec(name=name, port=free_port(), gpu=gpu, models=models, **extra)
        for name, (gpu, models, extra) in replicas.items()
    ]
    return HostSpec(time_scale=time_scale, seed=seed, replicas=reps)


def http(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any, dict[str, str]]:
    """GET (or POST ``body`` as JSON / ``raw`` bytes): status, decoded JSON or text, headers."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, payload, headers = resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        status, payload, headers = err.code, err.read(), dict(err.headers)
    text = payload.decode()
    try:
        return status, json.loads(text), headers
    except ValueError:
        return status, text, headers


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture(scope="module")
def sim() -> Iterator[HostThread]:
    """Replicas: ``a`` (H100, 8B + 70B), ``b`` (L4, 8B), ``full`` (waiting queue of 0)."""
    spec = make_spec(
        a=("h100-80g", [M8, M70], {}),
        b=("l4-24g", [M8], {}),
        full=("a100-80g", [M8], {"max_waiting": 0}),
    )
    with run_in_thread(spec) as host:
        yield host
