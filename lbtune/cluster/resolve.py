"""A cluster config made concrete: every replica named, every port decided.

:mod:`lbtune.cluster.config` validates what the user wrote; this module turns a valid
config into the names, ports and URLs the cluster starts with.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from lbtune.cluster.config import LOOPBACK, ClusterConfig
from lbtune.errors import ClusterError, ConfigError
from lbtune.process import probes


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica behind the balancer (simulated or external)."""

    name: str
    host: str
    port: int
    models: tuple[str, ...]
    gpu: str | None = None
    external: bool = False
    """Not simulated: an existing server, or a real vLLM the cluster starts (``vllm``)."""
    vllm: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Ports:
    balancer: int
    stats: int
    prometheus: int
    exporter: int
    agent: int | None = None
    """The agent's /metrics port; ``None`` when the agent is not enabled."""


@dataclass(frozen=True, slots=True)
class ResolvedCluster:
    """A config with every name and port decided."""

    config: ClusterConfig
    ports: Ports
    replicas: tuple[Replica, ...]

    @property
    def models(self) -> list[str]:
        return sorted({m for r in self.replicas for m in r.models})

    @property
    def simulated(self) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if not r.external)

    def serving(self, model: str) -> list[Replica]:
        return [r for r in self.replicas if model in r.models]


PORTS_ENV = "LBTUNE_PORTS"
"""``LOW-HIGH``: pick free ports in this range only. The test suite gives each of its
parallel workers its own range below the OS's ephemeral one, so that a port picked here is
not taken by another worker's pick or an outgoing connection before it is bound."""


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free right now on ``host`` (the OS's pick, or one of ``$LBTUNE_PORTS``)."""
    span = os.environ.get(PORTS_ENV)
    if not span:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    low, _, high = span.partition("-")
    if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) <= 65535):
        raise ConfigError(f"{PORTS_ENV}={span!r}: expected LOW-HIGH, e.g. 20000-21999")
    size = int(high) - int(low) + 1
    first = secrets.randbelow(size)
    for i in range(size):
        port = int(low) + (first + i) % size
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise ConfigError(f"{PORTS_ENV}={span}: no free port left on {host}")


def resolve(config: ClusterConfig, pick_port: Callable[[], int] = free_port) -> ResolvedCluster:
    """Name the replicas and fix every port (``0`` → a free port)."""
    taken: set[int] = set()

    def port(value: int) -> int:
        if value > 65535:
            raise ConfigError(f"cluster {config.name!r}: replica port {value} is out of range")
        p = value
        while p == 0 or p in taken:
            if value != 0:
                raise ConfigError(f"cluster {config.name!r}: port {value} is used twice")
            p = pick_port()
        taken.add(p)
        return p

    cp = config.ports
    ports = Ports(
        balancer=port(cp.balancer),
        stats=port(cp.stats),
        prometheus=port(cp.prometheus),
        exporter=port(cp.exporter),
        agent=port(cp.agent) if config.agent.enabled else None,
    )
    return ResolvedCluster(config=config, ports=ports, replicas=_replicas(config, port))


def _replicas(config: ClusterConfig, port: Callable[[int], int]) -> tuple[Replica, ...]:
    """The config's replicas, named, on the ports ``port`` decides."""
    base = config.ports.replica_base
    if config.external:
        out = []
        for ext in config.external:
            parts = urlsplit(ext.url)
            assert parts.hostname is not None and parts.port is not None
            out.append(
                Replica(ext.name, parts.hostname, parts.port, tuple(ext.models), external=True)
            )
        return tuple(out)
    if config.vllm is not None:
        v = config.vllm
        return tuple(
            Replica(
                f"{v.name}-{i}",
                LOOPBACK,
                port(base + i if base else 0),
                (v.model,),
                "cpu",
                external=True,
                vllm=True,
            )
            for i in range(v.count)
        )
    replicas: list[Replica] = []
    counters: dict[str, int] = {}
    for group in config.replicas:
        for _ in range(group.count):
            i = counters.get(group.prefix, 0)
            counters[group.prefix] = i + 1
            p = port(base + len(replicas) if base else 0)
            replicas.append(
                Replica(f"{group.prefix}-{i}", LOOPBACK, p, tuple(group.models), group.gpu)
            )
    return tuple(replicas)


def check_ports(cluster: ResolvedCluster, source: str) -> None:
    """Raise ClusterError naming the first port the cluster would bind on loopback that
    is already in use, and the field of ``source`` (the cluster file) that sets it."""
    p = cluster.ports
    wanted = [
        ("balancer", p.balancer),
        ("stats", p.stats),
        ("prometheus", p.prometheus),
        ("exporter", p.exporter),
        *([("agent", p.agent)] if p.agent is not None else []),
    ] + [(f"replica {r.name}", r.port) for r in cluster.replicas if not r.external or r.vllm]
    for what, port in wanted:
        if probes.port_busy(LOOPBACK, port):
            field = "replica_base" if what.startswith("replica") else what
            raise ClusterError(
                f"Port {port} ({what}) is already in use on {LOOPBACK}; stop what listens "
                f"there, or change ports.{field} in {source} (or use `ports: auto`)"
            )
