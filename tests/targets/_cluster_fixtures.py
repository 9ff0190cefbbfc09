"""What the Envoy and nginx target tests share: mini2's two simulated replicas in one sim
process, the embedded cluster with a given balancer, a target reset to its baseline, and the
``apply``/``rollback`` CLI. Processes run on free loopback ports and are always stopped (by
their own PID)."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import typer

from lbtune.cli.apply import apply_command, rollback_command
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.cluster.resolve import free_port as free_port
from lbtune.records.endpoints import Endpoints
from lbtune.targets import get_target
from lbtune.targets.base import ReplicaAddress
from lbtune.targets.targetbase import TargetBase

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"
SIM_START_S = 30.0
T = TypeVar("T", bound=TargetBase)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; waits for the exit either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def mini2_replicas() -> tuple[ReplicaAddress, ...]:
    """``h100-0`` serves the 8B and the 70B model, ``l4-0`` the 8B (as in mini2)."""
    return (
        ReplicaAddress("h100-0", "127.0.0.1", free_port(), (M8, M70), "h100-80g"),
        ReplicaAddress("l4-0", "127.0.0.1", free_port(), (M8,), "l4-24g"),
    )


def _healthy(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=1)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def sim_replicas(tmp: Path, time_scale: float = 8.0) -> Iterator[tuple[ReplicaAddress, ...]]:
    """:func:`mini2_replicas` served by one sim process (seed 0) until the block ends."""
    reps = mini2_replicas()
    cmd = [sys.executable, "-m", "lbtune.sim", "--time-scale", str(time_scale), "--seed", "0"]
    for r in reps:
        cmd += ["--replica", f"{r.name}:{r.port}:{r.gpu}:{','.join(r.models)}"]
    log = tmp / "sim.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SIM_START_S
        pending = [r.url for r in reps]
        while pending:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sim did not start: {log.read_text()[-2000:]}")
            if _healthy(pending[0]):
                pending.pop(0)
            else:
                time.sleep(0.05)
        yield reps
    finally:
        stop_process(proc)


def embedded_cluster(
    tmp_path_factory: pytest.TempPathFactory, config: str, *, missing: str | None = None
) -> Iterator[Endpoints]:
    """The embedded cluster of the built-in config ``config``, brought down afterwards.

    Skipped where Prometheus is not installed, or where ``missing`` names what else is not.
    """
    if missing is None and shutil.which("prometheus") is None:
        missing = "prometheus"
    if missing is not None:
        pytest.skip(f"{missing} is needed")
    state = tmp_path_factory.mktemp(config)
    try:
        yield api.up(load_config(config)[0], state)
    finally:
        api.down(state)


def baseline_target(cluster: Endpoints, name: str, kind: type[T]) -> T:
    """The cluster's ``name`` target (a ``kind``) with its baseline live and no last known
    good recorded."""
    target = get_target(name, cluster)
    assert isinstance(target, kind)
    target.apply(target.space().baseline())
    shutil.rmtree(target.state_dir / "lkg", ignore_errors=True)
    return target


def chat_body(
    model: str, *, stream: bool = False, max_tokens: int = 4, content: str = "hi"
) -> dict[str, Any]:
    """A one-message chat completion request (``stream`` only where true)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream"] = True
    return body


def apply_cli() -> typer.Typer:
    """``apply`` and ``rollback`` as the CLI has them, for ``CliRunner``."""
    app = typer.Typer()
    app.command("apply")(apply_command)
    app.command("rollback")(rollback_command)
    return app
