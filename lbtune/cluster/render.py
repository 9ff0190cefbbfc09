"""Config files for the cluster's processes: HAProxy and Prometheus (Jinja2), the sim host (JSON).

The templates live in ``playbooks/templates/`` because the Ansible playbooks render the
same files; every knob is a template variable with the untuned default, and the
``*_context`` functions here build the variables from a resolved cluster.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2

import lbtune
from lbtune.cluster.config import LOOPBACK, ResolvedCluster
from lbtune.cluster.state import Endpoints, StatePaths
from lbtune.errors import ClusterError, DependencyError
from lbtune.sim.spec import HostSpec, ReplicaSpec

TEMPLATES_DIR = Path(lbtune.__file__).resolve().parent.parent / "playbooks" / "templates"
ALL_BACKEND = "all"
INSTALL_HINT = "install it with `sudo apt-get install haproxy prometheus` (or `make demo`)"


def backend_names(models: list[str]) -> dict[str, str]:
    """Model name → HAProxy backend name (``model_<name>`` with unsafe characters replaced)."""
    out: dict[str, str] = {}
    for model in models:
        base = "model_" + re.sub(r"[^A-Za-z0-9_.-]", "_", model)
        name, i = base, 1
        while name in out.values() or name == ALL_BACKEND:
            i += 1
            name = f"{base}_{i}"
        out[model] = name
    return out


def haproxy_context(cluster: ResolvedCluster, paths: StatePaths) -> dict[str, Any]:
    """Template variables for ``haproxy.cfg.j2`` (knobs left to the template's defaults)."""
    return base_haproxy_context(
        state_dir=str(paths.root),
        balancer_port=cluster.ports.balancer,
        stats_port=cluster.ports.stats,
        servers=[(r.name, r.host, r.port, list(r.models)) for r in cluster.replicas],
        models=list(cluster.models),
    )


def endpoints_haproxy_context(ep: Endpoints) -> dict[str, Any]:
    """The same variables as :func:`haproxy_context`, from a running cluster's endpoints
    (what the HAProxy target re-renders the config from)."""
    servers = []
    for r in ep.replicas:
        url = urlsplit(r.url)
        servers.append((r.name, url.hostname or LOOPBACK, url.port or 80, list(r.models)))
    return base_haproxy_context(
        state_dir=ep.state_dir,
        balancer_port=urlsplit(ep.balancer_url).port or 80,
        stats_port=urlsplit(ep.stats_url).port or 80,
        servers=servers,
        models=list(ep.backends),
    )


def base_haproxy_context(
    *,
    state_dir: str,
    balancer_port: int,
    stats_port: int,
    servers: list[tuple[str, str, int, list[str]]],
    models: list[str],
) -> dict[str, Any]:
    backends = backend_names(models)
    return {
        "haproxy_state_dir": state_dir,
        "haproxy_bind_address": LOOPBACK,
        "haproxy_balancer_port": balancer_port,
        "haproxy_stats_port": stats_port,
        "haproxy_all_backend": ALL_BACKEND,
        "haproxy_servers": [
            {"name": name, "address": host, "port": port, "models": list(served)}
            for name, host, port, served in servers
        ],
        "haproxy_models": [
            {"name": m, "backend": backends[m], "regex": re.escape(m)} for m in models
        ],
    }


def prometheus_context(cluster: ResolvedCluster) -> dict[str, Any]:
    """Template variables for ``prometheus.yml.j2``."""
    return {
        "prometheus_replicas": [
            {"name": r.name, "address": r.host, "port": r.port, "gpu": r.gpu}
            for r in cluster.replicas
        ],
        "prometheus_haproxy_target": f"{LOOPBACK}:{cluster.ports.stats}",
        "prometheus_lbtune_target": f"{LOOPBACK}:{cluster.ports.exporter}",
        "prometheus_agent_target": (
            f"{LOOPBACK}:{cluster.ports.agent}" if cluster.ports.agent is not None else ""
        ),
    }


@functools.cache
def _environment() -> jinja2.Environment:
    """One environment per process: it caches compiled templates (a compile is ~45 ms, a
    render ~1 ms; the loader still notices an edited template by its mtime)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(name: str, context: dict[str, Any]) -> str:
    try:
        return _environment().get_template(name).render(**context)
    except jinja2.TemplateError as exc:
        raise ClusterError(f"{TEMPLATES_DIR / name}: cannot render: {exc}") from None


def render_haproxy(cluster: ResolvedCluster, paths: StatePaths) -> str:
    return render_template("haproxy.cfg.j2", haproxy_context(cluster, paths))


def render_prometheus(cluster: ResolvedCluster) -> str:
    return render_template("prometheus.yml.j2", prometheus_context(cluster))


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


def _haproxy_check(cfg: Path, quiet: bool) -> subprocess.CompletedProcess[str]:
    cmd = [require("haproxy"), "-c", *(["-q"] if quiet else []), "-f", str(cfg)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


def validate_haproxy(cfg: Path) -> None:
    """``haproxy -c -q -f cfg``; a rejected config is a ClusterError with HAProxy's words."""
    if _haproxy_check(cfg, quiet=True).returncode == 0:
        return
    proc = _haproxy_check(cfg, quiet=False)  # -q hides the alerts: ask again for them
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    alerts = [ln.split(" : ", 1)[-1] for ln in lines if "ALERT" in ln] or lines
    raise ClusterError(f"HAProxy rejects {cfg}: " + " | ".join(alerts[:3]))
