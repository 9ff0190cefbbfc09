"""vllm-router in the registry: the embedded cluster's launch, health and scrape job, and
the :class:`~lbtune.targets.vllm_router.target.VllmRouterTarget` factory."""

from __future__ import annotations

from pathlib import Path

from lbtune.cluster.state import Endpoints
from lbtune.errors import TargetError
from lbtune.targets.base import (
    BalancerLaunch,
    ClusterShape,
    LaunchSpec,
    LiveWeights,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.vllm_router.target import VllmRouterTarget

__all__ = ["BALANCER", "VllmRouterBalancer"]


class VllmRouterBalancer:
    """vllm-router (PyPI, Rust): flags only, so every change is a restart."""

    name = "vllm-router"
    replica_header: str | None = None
    live_weights = False
    ansible_module = "lbtune_vllm_router"
    extra_ports: tuple[str, ...] = ()
    test_preset = "mini2-router"

    def check_cluster(self, shape: ClusterShape) -> str | None:
        if len({frozenset(m) for m in shape.replica_models}) > 1:
            return (
                "vllm-router does not route by model: with 'balancer: vllm-router' every "
                "replica must serve the same models"
            )
        return None

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        raise NotImplementedError  # moved here from lbtune.cluster.router next

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return (ScrapeJob("vllm-router", (f"{spec.host}:{spec.metrics_port}",)),)

    def problems(self, endpoints: Endpoints) -> list[str]:
        raise NotImplementedError  # moved here from lbtune.cluster.router next

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> VllmRouterTarget:
        return VllmRouterTarget(endpoints, space_file=space_file)

    def weights(self, endpoints: Endpoints) -> LiveWeights:
        raise TargetError("vllm-router takes no per-replica weights (no live weights API)")


BALANCER = VllmRouterBalancer()
