"""Config files for the cluster's own processes: Prometheus (Jinja2), the sim host (JSON).

The balancer's config is its target's business
(:meth:`lbtune.targets.targetbase.BalancerBase.launch`); templates are rendered by
:func:`lbtune.resources.render_template` (the Ansible playbooks render the same files).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

from lbtune.cluster.config import LOOPBACK
from lbtune.cluster.resolve import ResolvedCluster
from lbtune.errors import DependencyError
from lbtune.records.statedir import StatePaths
from lbtune.resources import render_template, templates_dir
from lbtune.sim.spec import HostSpec, ReplicaSpec
from lbtune.targets.base import ScrapeJob

TEMPLATES_DIR = templates_dir()
INSTALL_HINT = "install it with `sudo apt-get install prometheus` (or `make demo`)"


def prometheus_context(
    cluster: ResolvedCluster, balancer_jobs: Sequence[ScrapeJob] = ()
) -> dict[str, Any]:
    """Template variables for ``prometheus.yml.j2`` (``balancer_jobs``: the balancer's
    own jobs, from its :meth:`~lbtune.targets.targetbase.BalancerBase.scrape_jobs`)."""
    return {
        "prometheus_replicas": [
            {"name": r.name, "address": r.host, "port": r.port, "gpu": r.gpu}
            for r in cluster.replicas
        ],
        "prometheus_jobs": [
            {"job_name": j.job_name, "metrics_path": j.metrics_path, "targets": list(j.targets)}
            for j in balancer_jobs
        ],
        "prometheus_lbtune_target": f"{LOOPBACK}:{cluster.ports.exporter}",
        "prometheus_agent_target": (
            f"{LOOPBACK}:{cluster.ports.agent}" if cluster.ports.agent is not None else ""
        ),
    }


def render_prometheus(cluster: ResolvedCluster, balancer_jobs: Sequence[ScrapeJob] = ()) -> str:
    return render_template("prometheus.yml.j2", prometheus_context(cluster, balancer_jobs))


def sim_spec(cluster: ResolvedCluster, paths: StatePaths) -> HostSpec:
    """The sim host's spec: every simulated replica of the cluster, in one process."""
    return HostSpec(
        host=LOOPBACK,
        time_scale=cluster.config.time_scale,
        seed=cluster.config.seed,
        ground_truth_path=str(paths.ground_truth),
        replicas=[
            ReplicaSpec(name=r.name, port=r.port, gpu=r.gpu or "", models=list(r.models))
            for r in cluster.simulated
        ],
    )


def require(binary: str) -> str:
    """The path of ``binary`` on PATH, or a DependencyError saying how to install it."""
    found = shutil.which(binary)
    if found is None:
        raise DependencyError(f"`{binary}` not found on PATH; {INSTALL_HINT}")
    return found
