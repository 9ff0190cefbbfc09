"""Fixtures for the nginx target: two simulated replicas and an nginx launched through the
registry entry's own ``launch`` hook, on free loopback ports, always stopped afterwards."""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from lbtune.process import supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import LaunchSpec, ReplicaAddress
from lbtune.targets.nginx.balancer import BALANCER
from lbtune.targets.nginx.config import Site
from lbtune.targets.nginx.target import NginxTarget
from tests.targets._cluster_fixtures import M8, M70, chat_body, free_port, sim_replicas

MODELS = (M70, M8)

needs_nginx = pytest.mark.skipif(
    (shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")) is None
    or shutil.which("prometheus-nginx-exporter") is None,
    reason="nginx and prometheus-nginx-exporter are needed "
    "(sudo apt-get install nginx prometheus-nginx-exporter)",
)


class LocalSupervisor:
    """The cluster's supervisor functions behind the :class:`Supervisor` hook protocol."""

    def __init__(self, state_dir: Path) -> None:
        self.paths = StatePaths(state_dir)
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, ProcessRecord] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.records[name] = supervisor.start(name, argv, self.paths, env=dict(env or {}))

    def wait_until(self, check: Callable[[], str | None], timeout_s: float, what: str) -> None:
        supervisor.wait_until(check, timeout_s, what, list(self.records.values()))

    def stop(self, name: str) -> None:
        record = self.records.pop(name, None)
        if record is not None:
            supervisor.stop(record, self.paths)

    def stop_all(self) -> None:
        for name in reversed(list(self.records)):
            self.stop(name)


@dataclass
class Running:
    target: NginxTarget
    site: Site
    spec: LaunchSpec
    supervisor: LocalSupervisor

    @property
    def url(self) -> str:
        return self.site.url


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReplicaAddress, ...]]:
    """h100-0 serves both models, l4-0 the 8B (as in mini2), in one sim process."""
    with sim_replicas(tmp_path_factory.mktemp("sim")) as reps:
        yield reps


def launch(state_dir: Path, reps: tuple[ReplicaAddress, ...]) -> Running:
    spec = LaunchSpec(
        cluster_name="nginx-test",
        state_dir=state_dir,
        host="127.0.0.1",
        port=free_port(),
        metrics_port=free_port(),
        extra_ports={},
        replicas=reps,
        models=MODELS,
        params={},
    )
    sup = LocalSupervisor(state_dir)
    try:
        BALANCER.launch(spec, sup)
    except BaseException:
        sup.stop_all()
        raise
    site = Site(state_dir, spec.host, spec.port, reps, MODELS)
    return Running(NginxTarget(site), site, spec, sup)


@pytest.fixture(scope="module")
def nginx(
    replicas: tuple[ReplicaAddress, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """nginx + prometheus-nginx-exporter in front of the two replicas."""
    if (shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")) is None:
        pytest.skip("nginx is needed")
    running = launch(tmp_path_factory.mktemp("ng"), replicas)
    try:
        yield running
    finally:
        running.supervisor.stop_all()


def chat(
    url: str,
    model: str,
    *,
    stream: bool = False,
    max_tokens: int = 4,
    content: str = "hi",
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: (status, lower-cased headers, whole body)."""
    body = chat_body(model, stream=stream, max_tokens=max_tokens, content=content)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()
