"""Where the HAProxy of a cluster keeps its files, what it listens on, and ``haproxy -c``.

Files in the cluster's state dir: ``haproxy.cfg`` (rendered from
``lbtune/data/playbooks/templates/haproxy.cfg.j2``), ``haproxy.sock`` (runtime API, level admin),
``master.sock`` (master CLI: reload, show proc), ``haproxy.state`` (server-state-file:
runtime weights survive reloads), ``haproxy-params.json`` (what lbtune last applied).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lbtune.errors import ClusterError, DependencyError
from lbtune.records.endpoints import Endpoints
from lbtune.safety.lifeline import die_with_parent
from lbtune.targets.base import LaunchSpec, ReplicaAddress, pool_names

__all__ = ["ALL_BACKEND", "HaproxyFiles", "Site", "config_alerts", "require"]

ALL_BACKEND = "all"
"""The backend with every replica (``/v1/models``, ``/health``...)."""
INSTALL_HINT = "install it with `sudo apt-get install haproxy` (or `make demo`)"
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin


def require(binary: str = "haproxy") -> str:
    found = shutil.which(binary)
    if found is None:
        raise DependencyError(f"`{binary}` not found on PATH; {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class HaproxyFiles:
    """The HAProxy files of one state dir."""

    cfg: Path
    runtime_socket: str
    master_socket: str
    server_state: Path

    @classmethod
    def in_dir(cls, state_dir: str | Path) -> HaproxyFiles:
        root = Path(state_dir)
        return cls(
            cfg=root / "haproxy.cfg",
            runtime_socket=str(root / "haproxy.sock"),
            master_socket=str(root / "master.sock"),
            server_state=root / "haproxy.state",
        )

    @classmethod
    def of(cls, endpoints: Endpoints) -> HaproxyFiles:
        d = endpoints.balancer_details
        default = cls.in_dir(endpoints.state_dir)
        return cls(
            cfg=Path(d.get("haproxy_cfg", default.cfg)),
            runtime_socket=d.get("runtime_socket", default.runtime_socket),
            master_socket=d.get("master_socket", default.master_socket),
            server_state=Path(d.get("server_state_file", default.server_state)),
        )

    def details(self) -> dict[str, str]:
        """What :meth:`of` reads back from ``Endpoints.balancer_details``."""
        return {
            "haproxy_cfg": str(self.cfg),
            "runtime_socket": self.runtime_socket,
            "master_socket": self.master_socket,
            "server_state_file": str(self.server_state),
        }

    def check_socket_paths(self) -> None:
        for sock in (self.runtime_socket, self.master_socket):
            if len(sock.encode()) > _MAX_SOCKET_PATH:
                raise ClusterError(
                    f"State dir path too long for a unix socket ({sock}); use a shorter --state-dir"
                )


@dataclass(frozen=True)
class Site:
    """Where HAProxy listens and what it balances: the config's fixed part."""

    state_dir: str
    host: str
    port: int
    stats_port: int
    replicas: tuple[ReplicaAddress, ...]
    time_scale: float = 1.0
    """The simulated replicas' time scale (1 for real replicas): the LLM scheduler's
    engine rates are in GPU seconds, its SLOs in wall seconds."""

    @property
    def models(self) -> list[str]:
        return sorted({m for r in self.replicas for m in r.models})

    @classmethod
    def from_spec(cls, spec: LaunchSpec) -> Site:
        return cls(
            str(spec.state_dir), spec.host, spec.port, spec.metrics_port, spec.replicas,
            spec.time_scale,
        )  # fmt: skip

    @classmethod
    def from_endpoints(cls, ep: Endpoints) -> Site:
        url = urlsplit(ep.balancer_url)
        return cls(
            state_dir=ep.state_dir,
            host=url.hostname or "127.0.0.1",
            port=url.port or 80,
            stats_port=urlsplit(ep.stats_url).port or 80,
            replicas=ep.replica_addresses(),
            time_scale=ep.time_scale,
        )

    def context(self) -> dict[str, object]:
        """``haproxy.cfg.j2`` variables with every knob left to the template's default."""
        backends = pool_names(self.models)
        return {
            "haproxy_state_dir": self.state_dir,
            "haproxy_bind_address": self.host,
            "haproxy_balancer_port": self.port,
            "haproxy_stats_port": self.stats_port,
            "haproxy_all_backend": ALL_BACKEND,
            "haproxy_servers": [
                {"name": r.name, "address": r.host, "port": r.port, "models": list(r.models)}
                for r in self.replicas
            ],
            "haproxy_models": [
                {"name": m, "backend": backends[m], "regex": re.escape(m)} for m in self.models
            ],
        }


def _check(cfg: Path, quiet: bool) -> subprocess.CompletedProcess[str]:
    cmd = [require(), "-c", *(["-q"] if quiet else []), "-f", str(cfg)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=30, check=False, preexec_fn=die_with_parent()
    )


def config_alerts(cfg: Path) -> list[str] | None:
    """``None`` when ``haproxy -c`` accepts ``cfg``, else HAProxy's alerts (up to 3)."""
    if _check(cfg, quiet=True).returncode == 0:
        return None
    proc = _check(cfg, quiet=False)  # -q hides the alerts: ask again for them
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return ([ln.split(" : ", 1)[-1] for ln in lines if "ALERT" in ln] or lines)[:3]
