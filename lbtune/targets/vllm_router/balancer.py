"""vllm-router in the registry: how the embedded cluster launches and watches it, its
scrape job, and the :class:`~lbtune.targets.vllm_router.target.VllmRouterTarget` factory.

The router listens on the cluster's ``ports.balancer`` and serves its Prometheus metrics
(``vllm_router_*``) on ``ports.stats``. Its initial flags are the cluster YAML's
``params:`` over the space's baseline (vllm-router's own defaults).
"""

from __future__ import annotations

from pathlib import Path

from lbtune.errors import ClusterError, ConfigError, LbtuneError
from lbtune.metrics.promql import BalancerSeries
from lbtune.process.supervisor import read_record
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import (
    BalancerLaunch,
    ClusterShape,
    LaunchSpec,
    ReplicaRow,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import BalancerBase
from lbtune.targets.vllm_router import process
from lbtune.targets.vllm_router.target import SPACE_FILE, VllmRouterTarget

__all__ = ["BALANCER", "VllmRouterBalancer"]


class VllmRouterBalancer(BalancerBase):
    """vllm-router (PyPI, Rust): flags only, so every change is a restart (and no live
    weights); it sets no replica header."""

    name = "vllm-router"
    replica_header = None
    ansible_module = "lbtune_vllm_router"
    test_preset = "mini2-router"

    def check_cluster(self, shape: ClusterShape) -> str | None:
        if len({frozenset(m) for m in shape.replica_models}) > 1:
            return (
                "vllm-router does not route by model: with 'balancer: vllm-router' every "
                "replica must serve the same models"
            )
        try:
            ParameterSpace.load(SPACE_FILE).validate(shape.params, source="params")
        except ConfigError as exc:
            return str(exc)
        return None

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        space = ParameterSpace.load(SPACE_FILE)
        try:
            params = space.complete(space.validate(spec.params, source="params"), space.baseline())
            command = process.RouterCommand(
                params=process.active(dict(params)),
                worker_urls=tuple(r.url for r in spec.replicas),
                host=spec.host,
                port=spec.port,
                metrics_port=spec.metrics_port,
            )
        except LbtuneError as exc:
            raise ClusterError(f"cluster {spec.cluster_name!r}: vllm-router: {exc}") from None
        supervisor.start(process.COMPONENT, command.argv(), env={"NO_COLOR": "1"})
        supervisor.wait_until(
            lambda: process.health_missing(command.url),
            process.ROUTER_TIMEOUT,
            "vllm-router /health",
        )
        paths = StatePaths(spec.state_dir)
        record = read_record(paths, process.COMPONENT)
        if record is None:  # pragma: no cover - supervisor.start writes it
            raise ClusterError(f"vllm-router's PID file is missing in {spec.state_dir}")
        process.write_state(paths, command, record)
        return BalancerLaunch(
            components=(process.COMPONENT,),
            stats_url=f"http://{spec.host}:{spec.metrics_port}/metrics",
            metrics_url=f"http://{spec.host}:{spec.metrics_port}/metrics",
        )

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return (ScrapeJob("vllm-router", (f"{spec.host}:{spec.metrics_port}",)),)

    def problems(self, endpoints: Endpoints) -> list[str]:
        found = process.health_missing(endpoints.balancer_url)
        return [] if found is None else [found]

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """The replicas in the running router's ``--worker-urls`` (it reports no
        per-worker state lbtune reads; its policy is the same for every worker)."""
        try:
            _, command = process.live_command(StatePaths(Path(endpoints.state_dir)))
        except (LbtuneError, OSError):
            return []
        urls = {u.rstrip("/") for u in command.worker_urls}
        return [
            ReplicaRow(r.name, "worker") for r in endpoints.replicas if r.url.rstrip("/") in urls
        ]

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> VllmRouterTarget:
        return VllmRouterTarget(endpoints, space_file=space_file)

    def series(self, endpoints: Endpoints) -> BalancerSeries:
        """The requests running on each worker (labelled by its URL: named here as its
        replica); the router has no queue of its own and no responses by code."""
        return BalancerSeries(
            self.name,
            sessions="vllm_router_running_requests",
            server_label="worker",
            server_names={r.url.rstrip("/"): r.name for r in endpoints.replicas},
        )


BALANCER = VllmRouterBalancer()
