"""Health of a cluster: readiness checks used while starting, and the status records.

Each check returns ``None`` when its part is ready, else a short description of what
is still missing (used in timeouts and in ``lbtune cluster status``).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from lbtune.process import probes, supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import AGENT, PROMETHEUS, SIM

# ---------------------------------------------------------------------------------------
# Results.


class ComponentStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    pid: int | None
    running: bool
    log: str


class ReplicaStatus(BaseModel):
    """Health and load of one replica (its own ``/health`` and ``/metrics``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    gpu: str | None
    models: list[str]
    healthy: bool
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    """``vllm:kv_cache_usage_perc`` (0-1)."""


class ClusterStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: str
    running: bool
    """At least one of the cluster's processes is alive."""
    healthy: bool
    """Everything is up: processes, replicas, the balancer, Prometheus."""
    endpoints: Endpoints | None
    components: list[ComponentStatus]
    replicas: list[ReplicaStatus]
    problems: list[str]


# ---------------------------------------------------------------------------------------
# Readiness checks: each returns None when ready, else what is missing.


def replicas_missing(urls: dict[str, str]) -> str | None:
    bad = [name for name, url in urls.items() if not probes.healthy(url, timeout=0.5)]
    return f"/health not 200 on {', '.join(bad)}" if bad else None


def prometheus_missing(ep: Endpoints) -> str | None:
    """``None`` once Prometheus scrapes every replica and every balancer job."""
    targets = probes.prometheus_targets(ep.prometheus_url)
    if not targets:
        return f"{ep.prometheus_url}/api/v1/targets not answering"
    up = [t.get("labels", {}) for t in targets if t.get("health") == "up"]
    scraped = {lb.get("replica") for lb in up if lb.get("job") == "replicas"}
    missing = sorted({r.name for r in ep.replicas} - scraped)
    if missing:
        return f"replica targets not scraped yet: {', '.join(missing)}"
    jobs = {lb.get("job") for lb in up}
    late = [j for j in ep.balancer_jobs if j not in jobs]
    return f"{', '.join(late)} target not scraped yet" if late else None


AGENT_JOB = "lbtune-agent"


def agent_missing(ep: Endpoints) -> str | None:
    """The agent serves ``/metrics`` and Prometheus scrapes it (job ``lbtune-agent``)."""
    if ep.agent_metrics_url is None:
        return None
    if probes.http_get(ep.agent_metrics_url, timeout=1.0)[0] != 200:
        return f"agent {ep.agent_metrics_url} not answering"
    targets = probes.prometheus_targets(ep.prometheus_url)
    if not any(
        t.get("labels", {}).get("job") == AGENT_JOB and t.get("health") == "up" for t in targets
    ):
        return "agent target not scraped yet"
    return None


def problems(
    ep: Endpoints,
    records: list[ProcessRecord],
    balancer_problems: Callable[[Endpoints], list[str]],
) -> list[str]:
    """What is wrong with a running cluster (empty when healthy): every process it should
    run, the replicas, the balancer (its own
    :meth:`~lbtune.targets.targetbase.BalancerBase.problems`), Prometheus' scrapes and the
    agent.

    The keeper (:mod:`lbtune.cluster.keeper`) is not among them: it serves nothing and
    measures nothing, so a cluster without it runs and measures exactly as well, and
    counting it would make ``up`` refuse a working cluster whose keeper gave up (``up``
    starts it again instead). ``status`` still lists it with whether it runs.
    """
    simulated = any(not r.external for r in ep.replicas)
    expected = [*([SIM] if simulated else []), PROMETHEUS, *ep.balancer_components]
    if ep.agent_config is not None:
        expected.append(AGENT)
    alive = {r.name for r in records if supervisor.alive(r)}
    found: list[str | None] = [f"{name} is not running" for name in expected if name not in alive]
    found.append(replicas_missing({r.name: r.url for r in ep.replicas}))
    if all(c in alive for c in ep.balancer_components):
        found += balancer_problems(ep)
    if PROMETHEUS in alive:
        found.append(prometheus_missing(ep))
    if AGENT in alive and PROMETHEUS in alive:
        found.append(agent_missing(ep))
    return [p for p in found if p is not None]
