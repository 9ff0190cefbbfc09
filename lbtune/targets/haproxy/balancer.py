"""HAProxy in the registry: the embedded cluster's launch, health and scrape job, and the
:class:`~lbtune.targets.haproxy.target.HaproxyTarget` factory."""

from __future__ import annotations

from pathlib import Path

from lbtune.cluster.state import Endpoints
from lbtune.targets.base import (
    DEFAULT_REPLICA_HEADER,
    BalancerLaunch,
    ClusterShape,
    LaunchSpec,
    LiveWeights,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.haproxy.target import HaproxyTarget

__all__ = ["BALANCER", "HaproxyBalancer"]


class HaproxyBalancer:
    """HAProxy 2.6 (``-W`` master-worker, runtime API, hitless reloads)."""

    name = "haproxy"
    replica_header: str | None = DEFAULT_REPLICA_HEADER
    live_weights = True
    ansible_module = "lbtune_haproxy"
    extra_ports: tuple[str, ...] = ()
    test_preset = "mini2"

    def check_cluster(self, shape: ClusterShape) -> str | None:
        return None

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        raise NotImplementedError  # moved here from lbtune.cluster.api next

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return (ScrapeJob("haproxy", (f"{spec.host}:{spec.metrics_port}",)),)

    def problems(self, endpoints: Endpoints) -> list[str]:
        raise NotImplementedError  # moved here from lbtune.cluster.health next

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> HaproxyTarget:
        return HaproxyTarget(endpoints, space_file=space_file)

    def weights(self, endpoints: Endpoints) -> LiveWeights:
        raise NotImplementedError  # moved here from lbtune.agent next


BALANCER = HaproxyBalancer()
