"""The cluster's state dir and the endpoints record other commands read.

Layout of a state dir (default ``$LBTUNE_STATE_DIR``, else
``$XDG_STATE_HOME/lbtune/<cluster>`` or ``~/.local/state/lbtune/<cluster>``)::

    config.json          the validated cluster config `up` ran with
    endpoints.json       balancer/Prometheus/replica URLs, sockets (see Endpoints)
    sim.json             the HostSpec given to `python -m lbtune.sim`
    haproxy.cfg          rendered from playbooks/templates/haproxy.cfg.j2
    haproxy.sock         HAProxy runtime API (level admin)
    master.sock          HAProxy master CLI (reload, show proc)
    haproxy.state        server-state-file (runtime weights survive reloads)
    prometheus.yml       rendered from playbooks/templates/prometheus.yml.j2
    prometheus-data/     Prometheus TSDB
    ground_truth.jsonl   the sim's per-request server-side timestamps
    agent.yaml           the feedback agent's settings (when the cluster YAML enables it)
    sim.pid haproxy.pid prometheus.pid agent.pid   one JSON record per started process
    logs/sim.log logs/haproxy.log logs/prometheus.log logs/agent.log
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from lbtune.errors import ClusterError

COMPONENTS = ("sim", "haproxy", "prometheus")
AGENT = "agent"
"""The feedback agent's component name (``agent.pid``, ``logs/agent.log``)."""
# sun_path is 108 bytes on Linux; keep a margin.
_MAX_SOCKET_PATH = 100


def state_root() -> Path:
    """Where state dirs of named clusters live."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "lbtune"


def state_dir_for(name: str, explicit: str | Path | None = None) -> Path:
    """The state dir: ``explicit``, else ``$LBTUNE_STATE_DIR``, else the root + name."""
    if explicit is not None:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get("LBTUNE_STATE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    return state_root() / name


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Every file of one state dir."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.json"

    @property
    def sim_spec(self) -> Path:
        return self.root / "sim.json"

    @property
    def haproxy_cfg(self) -> Path:
        return self.root / "haproxy.cfg"

    @property
    def runtime_socket(self) -> Path:
        return self.root / "haproxy.sock"

    @property
    def master_socket(self) -> Path:
        return self.root / "master.sock"

    @property
    def server_state(self) -> Path:
        return self.root / "haproxy.state"

    @property
    def prometheus_yml(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def prometheus_data(self) -> Path:
        return self.root / "prometheus-data"

    @property
    def ground_truth(self) -> Path:
        return self.root / "ground_truth.jsonl"

    @property
    def agent_config(self) -> Path:
        return self.root / "agent.yaml"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def pid_file(self, component: str) -> Path:
        return self.root / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def create(self) -> None:
        """Create the dirs and check the sockets' paths fit in a unix address."""
        for sock in (self.runtime_socket, self.master_socket):
            if len(str(sock).encode()) > _MAX_SOCKET_PATH:
                raise ClusterError(
                    f"State dir path too long for a unix socket ({sock}); use a shorter --state-dir"
                )
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prometheus_data.mkdir(parents=True, exist_ok=True)


class ReplicaEndpoint(BaseModel):
    """One replica as seen by clients and by Prometheus."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    models: list[str]
    gpu: str | None = None
    external: bool = False


class Endpoints(BaseModel):
    """What a running cluster offers: written to ``endpoints.json`` by ``up``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config_name: str
    config_path: str
    state_dir: str
    balancer_url: str
    """The OpenAI-compatible API through HAProxy (``/v1/chat/completions``...)."""
    stats_url: str
    """HAProxy's stats page."""
    haproxy_metrics_url: str
    """HAProxy's built-in Prometheus exporter."""
    prometheus_url: str
    exporter_port: int
    """Where lbtune's client-side exporter must listen (Prometheus job ``lbtune``)."""
    exporter_url: str
    runtime_socket: str
    """HAProxy runtime API (admin): ``set weight be/srv N``, ``show servers state``."""
    master_socket: str
    """HAProxy master CLI: ``reload``, ``show proc``."""
    server_state_file: str
    haproxy_cfg: str
    prometheus_yml: str
    backends: dict[str, str]
    """Model name → the HAProxy backend holding the replicas that serve it."""
    all_backend: str
    """The backend with every replica (``/v1/models``, ``/health``...)."""
    replicas: list[ReplicaEndpoint]
    time_scale: float
    ground_truth_path: str | None
    """The sim's per-request ground truth (JSONL); ``None`` for external replicas."""
    balancer: str = "haproxy"
    """``haproxy`` or ``vllm-router``."""
    agent_config: str | None = None
    """The feedback agent's settings file (``agent.yaml``) when the cluster runs the agent
    (it then owns the per-server weights); ``None`` otherwise."""
    agent_metrics_url: str | None = None
    """The agent's own ``/metrics`` (Prometheus job ``lbtune-agent``) when it runs."""

    @property
    def models(self) -> list[str]:
        return sorted(self.backends)


def write_json_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_endpoints(paths: StatePaths, endpoints: Endpoints) -> None:
    write_json_atomic(paths.endpoints, endpoints.model_dump_json(indent=2) + "\n")


def read_endpoints(paths: StatePaths) -> Endpoints | None:
    """The endpoints of the cluster in ``paths``, or ``None`` when there are none."""
    try:
        text = paths.endpoints.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return Endpoints.model_validate_json(text)
    except ValueError as exc:
        raise ClusterError(
            f"{paths.endpoints} is unreadable ({exc.__class__.__name__}); "
            f"run `lbtune cluster down --state-dir {paths.root}`"
        ) from None


def read_config_json(paths: StatePaths) -> object | None:
    try:
        data: object = json.loads(paths.config.read_text(encoding="utf-8"))
        return data
    except (FileNotFoundError, ValueError):
        return None
