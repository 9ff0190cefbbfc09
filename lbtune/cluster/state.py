"""The cluster's state dir and the endpoints record other commands read.

Layout of a state dir (default ``$LBTUNE_STATE_DIR``, else
``$XDG_STATE_HOME/lbtune/<cluster>`` or ``~/.local/state/lbtune/<cluster>``)::

    config.json          the validated cluster config `up` ran with
    endpoints.json       balancer/Prometheus/replica URLs (see Endpoints)
    sim.json             the HostSpec given to `python -m lbtune.sim`
    prometheus.yml       rendered from lbtune/data/playbooks/templates/prometheus.yml.j2
    prometheus-data/     Prometheus TSDB
    ground_truth.jsonl   the sim's per-request server-side timestamps
    agent.yaml           the feedback agent's settings (when the cluster YAML enables it)
    lkg/                 lbtune.apply's last known good per target
    <component>.pid      one JSON record per started process (sim, prometheus, the
                         balancer's components, agent)
    logs/<component>.log
    ...                  the balancer's own files (its config, sockets): its target
                         subpackage documents them (e.g. haproxy.cfg, haproxy.sock)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from lbtune.errors import ClusterError

SIM = "sim"
PROMETHEUS = "prometheus"
AGENT = "agent"
"""The feedback agent's component name (``agent.pid``, ``logs/agent.log``)."""


@dataclass(frozen=True)
class ReplicaAddress:
    """One replica behind the balancer."""

    name: str
    """Unique, ``[A-Za-z0-9][A-Za-z0-9_.-]*``: use it as the server/endpoint name and as
    the value of the replica header."""
    host: str
    port: int
    models: tuple[str, ...]
    """The model names it serves (``"model"`` in an OpenAI request body)."""
    gpu: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


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
        """Create the dirs."""
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
    balancer: str
    """The balancer's registry name (:data:`lbtune.targets.TARGETS`)."""
    balancer_url: str
    """The OpenAI-compatible API through the balancer (``/v1/chat/completions``...)."""
    stats_url: str
    """The balancer's stats/admin page."""
    balancer_metrics_url: str
    """The balancer's Prometheus exposition (or its exporter's)."""
    balancer_components: list[str]
    """The supervisor components the balancer runs as (``<name>.pid``)."""
    balancer_jobs: list[str]
    """The balancer's Prometheus jobs (``job`` label)."""
    balancer_details: dict[str, str]
    """Balancer-specific facts (config file, sockets) only its target reads."""
    replica_header: str | None
    """The response header naming the replica that served a request, if the balancer sets one."""
    prometheus_url: str
    exporter_port: int
    """Where lbtune's client-side exporter must listen (Prometheus job ``lbtune``)."""
    exporter_url: str
    prometheus_yml: str
    replicas: list[ReplicaEndpoint]
    time_scale: float
    ground_truth_path: str | None
    """The sim's per-request ground truth (JSONL); ``None`` for external replicas."""
    agent_config: str | None = None
    """The feedback agent's settings file (``agent.yaml``) when the cluster runs the agent
    (it then owns the per-server weights); ``None`` otherwise."""
    agent_metrics_url: str | None = None
    """The agent's own ``/metrics`` (Prometheus job ``lbtune-agent``) when it runs."""

    @property
    def models(self) -> list[str]:
        """Every model served, sorted."""
        return sorted({m for r in self.replicas for m in r.models})

    def replica_addresses(self) -> tuple[ReplicaAddress, ...]:
        """The replicas as the target contract passes them."""
        out = []
        for r in self.replicas:
            url = urlsplit(r.url)
            out.append(
                ReplicaAddress(
                    name=r.name,
                    host=url.hostname or "127.0.0.1",
                    port=url.port or 80,
                    models=tuple(r.models),
                    gpu=r.gpu,
                )
            )
        return tuple(out)


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
