"""HAProxy in the registry: how the embedded cluster launches and watches it, its scrape
job, its live weights (the feedback agent's actuator), and the target factory.

The cluster's HAProxy runs master-worker (``haproxy -W -S master.sock``) from the
untuned ``haproxy.cfg`` (every knob at the template's default, which is the space's
baseline); the feedback agent, when the cluster runs it, sets the weights live.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lbtune.errors import ClusterError, TargetError
from lbtune.metrics.promql import BalancerSeries
from lbtune.process import probes
from lbtune.records.endpoints import Endpoints
from lbtune.targets.base import (
    BalancerLaunch,
    ClusterShape,
    LaunchSpec,
    ReplicaRow,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.haproxy import config, llm
from lbtune.targets.haproxy.files import ALL_BACKEND, HaproxyFiles, Site, config_alerts, require
from lbtune.targets.haproxy.runtime import MAX_WEIGHT, HaproxyRuntime
from lbtune.targets.haproxy.target import HaproxyTarget
from lbtune.targets.targetbase import BalancerBase

__all__ = ["BALANCER", "COMPONENT", "HaproxyBalancer", "HaproxyWeights"]

COMPONENT = "haproxy"
START_TIMEOUT = 15.0
SERIES = BalancerSeries(
    "haproxy",
    queue="haproxy_backend_current_queue",
    pool_label="proxy",
    sessions="haproxy_server_current_sessions",
    responses="haproxy_server_http_responses_total",
    server_label="server",
    code_label="code",
)
"""HAProxy's exporter: the queue of each backend (``proxy``), the sessions and the
responses by code class of each server (named as its replica)."""


def servers_missing(runtime: HaproxyRuntime, replicas: list[str], balancer_url: str) -> str | None:
    """``None`` once every replica is UP (L7 check passed) in the ``all`` backend and the
    balancer's ``/health`` answers 200."""
    try:
        servers = runtime.stat()
    except TargetError as exc:
        return str(exc)
    up = {
        s.server
        for s in servers
        if s.backend == ALL_BACKEND and s.status == "UP" and s.check_status.startswith("L7OK")
    }
    missing = sorted(set(replicas) - up)
    if missing:
        return f"servers not UP yet: {', '.join(missing)}"
    if probes.http_get(balancer_url + "/health", timeout=1.0)[0] != 200:
        return f"{balancer_url}/health not 200"
    return None


def _count(row: Mapping[str, str], column: str) -> int:
    """A ``show stat`` counter (empty where HAProxy leaves it out: 0)."""
    value = row.get(column) or "0"
    return int(value) if value.isdigit() else 0


class HaproxyWeights:
    """Per-replica weights through the runtime API: a replica's weight is set in every
    backend its server is in (one per model it serves, and ``all``)."""

    max_weight = MAX_WEIGHT

    def __init__(self, runtime: HaproxyRuntime) -> None:
        self.runtime = runtime

    def weights(self) -> dict[str, int]:
        return {s.server: s.weight for s in self.runtime.servers_state(ALL_BACKEND)}

    def set_weights(self, weights: Mapping[str, int]) -> None:
        rows = {(s.backend, s.server) for s in self.runtime.servers_state()}
        self.runtime.set_weights(
            {(be, srv): weights[srv] for be, srv in sorted(rows) if srv in weights}
        )


class HaproxyBalancer(BalancerBase):
    """HAProxy 2.6 (master-worker, runtime API, hitless reloads)."""

    name = "haproxy"
    live_weights = True
    ansible_module = "lbtune_haproxy"
    test_preset = "mini2"

    def check_cluster(self, shape: ClusterShape) -> str | None:
        if shape.params:
            return (
                "haproxy starts from its space's baseline: leave 'params' out and apply "
                "other values with `lbtune apply` once the cluster is up"
            )
        return None

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        files = HaproxyFiles.in_dir(spec.state_dir)
        files.check_socket_paths()
        binary = require()
        files.cfg.write_text(config.render_untuned(Site.from_spec(spec)), encoding="utf-8")
        files.server_state.unlink(missing_ok=True)  # a fresh start has no saved weights
        alerts = config_alerts(files.cfg)
        if alerts is not None:
            raise ClusterError(f"HAProxy rejects {files.cfg}: " + " | ".join(alerts))
        cmd = [binary, "-W", "-S", files.master_socket, "-f", str(files.cfg)]
        supervisor.start(COMPONENT, cmd)
        runtime = HaproxyRuntime(files.runtime_socket)
        url = f"http://{spec.host}:{spec.port}"
        names = [r.name for r in spec.replicas]
        supervisor.wait_until(
            lambda: servers_missing(runtime, names, url), START_TIMEOUT, "HAProxy servers UP"
        )
        stats = f"http://{spec.host}:{spec.metrics_port}"
        return BalancerLaunch(
            components=(COMPONENT,),
            stats_url=f"{stats}/stats",
            metrics_url=f"{stats}/metrics",
            details=files.details(),
        )

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        stats = (f"{spec.host}:{spec.metrics_port}",)
        # The LLM scheduler's counters (algorithm: llm; an empty page otherwise).
        return (ScrapeJob("haproxy", stats), ScrapeJob("haproxy-llm", stats, llm.METRICS_PATH))

    def problems(self, endpoints: Endpoints) -> list[str]:
        runtime = HaproxyRuntime(HaproxyFiles.of(endpoints).runtime_socket)
        found = servers_missing(
            runtime, [r.name for r in endpoints.replicas], endpoints.balancer_url
        )
        return [] if found is None else [found]

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """``show stat``: the ``all`` backend's status, sessions and errors (``econ`` +
        ``eresp``) summed over the backends; down is ``DOWN*`` or ``MAINT*`` (``UP 1/2``:
        a check failed, still up)."""
        try:
            stats = HaproxyRuntime(HaproxyFiles.of(endpoints).runtime_socket).stat()
        except (TargetError, ClusterError, OSError):
            return []
        rows = []
        for r in endpoints.replicas:
            mine = [s for s in stats if s.server == r.name]
            if not mine:
                continue
            main = next((s for s in mine if s.backend == ALL_BACKEND), mine[0])
            active = sum(s.scur for s in mine)
            failures = sum(_count(s.raw, "econ") + _count(s.raw, "eresp") for s in mine)
            down = main.status.startswith(("DOWN", "MAINT"))
            rows.append(ReplicaRow(r.name, main.status, main.weight, active, down, failures))
        return rows

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> HaproxyTarget:
        return HaproxyTarget(endpoints, space_file=space_file)

    def series(self, endpoints: Endpoints) -> BalancerSeries:
        return SERIES

    def weights(self, endpoints: Endpoints) -> HaproxyWeights:
        return HaproxyWeights(HaproxyRuntime(HaproxyFiles.of(endpoints).runtime_socket))


BALANCER = HaproxyBalancer()
