"""Where a running cluster's parts answer: the balancer, Prometheus and each replica.

``lbtune cluster up`` writes an :class:`Endpoints` to ``endpoints.json`` in the cluster's
state dir (:mod:`lbtune.records.statedir`); every other command reads it from there. The
target contract passes replicas as :class:`ReplicaAddress`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field


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
    reserved_cpus: list[int] = Field(default_factory=list)
    """The CPUs the cluster's servers are pinned to (the vLLM preset's ``vllm.cpus``): what
    else lbtune starts for this cluster, its load generator included, runs on the others
    (:func:`lbtune.process.affinity.complement`). Empty: nothing is pinned (and in records
    written before this field)."""

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
