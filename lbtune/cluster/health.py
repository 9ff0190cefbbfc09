"""Health of a cluster: readiness checks used while starting, and the status records.

Each check returns ``None`` when its part is ready, else a short description of what
is still missing (used in timeouts and in ``lbtune cluster status``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from lbtune.cluster import probes, supervisor
from lbtune.cluster.state import Endpoints
from lbtune.cluster.supervisor import ProcessRecord

# ---------------------------------------------------------------------------------------
# Results.


class ComponentStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    pid: int | None
    running: bool
    log: str


class ReplicaStatus(BaseModel):
    """Health and load of one replica: its own ``/metrics`` and HAProxy's view."""

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
    haproxy_status: str | None = None
    sessions: int | None = None
    """HAProxy's current sessions to this server, over every backend."""


class ClusterStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: str
    running: bool
    """At least one of the cluster's processes is alive."""
    healthy: bool
    """Everything is up: processes, replicas, HAProxy servers, Prometheus."""
    endpoints: Endpoints | None
    components: list[ComponentStatus]
    replicas: list[ReplicaStatus]
    problems: list[str]


# ---------------------------------------------------------------------------------------
# Readiness checks: each returns None when ready, else what is missing.


def replicas_missing(urls: dict[str, str]) -> str | None:
    bad = [name for name, url in urls.items() if not probes.healthy(url, timeout=0.5)]
    return f"/health not 200 on {', '.join(bad)}" if bad else None


def haproxy_missing(ep: Endpoints) -> str | None:
    try:
        servers = probes.haproxy_servers(ep.runtime_socket)
    except OSError as exc:
        return f"runtime API {ep.runtime_socket} not answering ({exc.strerror or exc})"
    names = {r.name for r in ep.replicas}
    up = {
        s.server
        for s in servers
        if s.backend == ep.all_backend and s.status == "UP" and s.check_status.startswith("L7OK")
    }
    if names - up:
        return f"servers not UP yet: {', '.join(sorted(names - up))}"
    if probes.http_get(ep.balancer_url + "/health", timeout=1.0)[0] != 200:
        return f"{ep.balancer_url}/health not 200"
    return None


def prometheus_missing(ep: Endpoints) -> str | None:
    targets = probes.prometheus_targets(ep.prometheus_url)
    if not targets:
        return f"{ep.prometheus_url}/api/v1/targets not answering"
    up = {
        t.get("labels", {}).get("replica")
        for t in targets
        if t.get("labels", {}).get("job") == "replicas" and t.get("health") == "up"
    }
    missing = sorted({r.name for r in ep.replicas} - up)
    haproxy_up = any(
        t.get("labels", {}).get("job") == "haproxy" and t.get("health") == "up" for t in targets
    )
    if missing:
        return f"replica targets not scraped yet: {', '.join(missing)}"
    return None if haproxy_up else "haproxy target not scraped yet"


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


def problems(ep: Endpoints, records: list[ProcessRecord], simulated: bool) -> list[str]:
    expected = ["sim", "haproxy", "prometheus"] if simulated else ["haproxy", "prometheus"]
    if ep.agent_config is not None:
        expected.append("agent")
    alive = {r.name for r in records if supervisor.alive(r)}
    found: list[str | None] = [f"{name} is not running" for name in expected if name not in alive]
    found.append(replicas_missing({r.name: r.url for r in ep.replicas}))
    if "haproxy" in alive:
        found.append(haproxy_missing(ep))
    if "prometheus" in alive:
        found.append(prometheus_missing(ep))
    if "agent" in alive and "prometheus" in alive:
        found.append(agent_missing(ep))
    return [p for p in found if p is not None]
