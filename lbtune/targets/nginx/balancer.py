"""nginx in the registry: the embedded cluster's launch (nginx + prometheus-nginx-exporter),
health and scrape job, and the :class:`~lbtune.targets.nginx.target.NginxTarget` factory.

Files, under the cluster's state dir: ``nginx/`` is nginx's prefix (``nginx.conf``, its own
``nginx.pid``, temp paths, ``route.sock``, ``status.sock``); the supervisor keeps
``nginx.pid``/``nginx-exporter.pid`` records and ``logs/nginx.log``/``logs/nginx-exporter.log``.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from lbtune.errors import ClusterError, ConfigError, TargetError
from lbtune.records.endpoints import Endpoints
from lbtune.targets.base import (
    DEFAULT_REPLICA_HEADER,
    BalancerLaunch,
    LaunchSpec,
    ReplicaAddress,
    ReplicaRow,
    ScrapeJob,
    Supervisor,
)
from lbtune.targets.nginx import process
from lbtune.targets.nginx.config import Site, render_config
from lbtune.targets.nginx.target import SPACE_FILE, NginxTarget
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import BalancerBase

__all__ = ["BALANCER", "NGINX", "NGINX_EXPORTER", "NginxBalancer", "site_of"]

NGINX = "nginx"
NGINX_EXPORTER = "nginx-exporter"
START_TIMEOUT_S = 15.0
PROGRAM_LINK = "nginx:"
"""The nginx master retitles itself ``nginx: master process ...``; started through a link
of this name, its first argv word stays the one the supervisor recorded (its identity
check compares them), so ``lbtune cluster down`` from another process still finds it."""


def _get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, ValueError):
        return 0, b""


def health_missing(url: str) -> str | None:
    """``None`` when ``GET <url>/health`` through nginx answers 200."""
    status, _ = _get(url.rstrip("/") + "/health")
    return None if status == 200 else f"{url}/health answered {status or 'nothing'}"


def exporter_missing(metrics_url: str) -> str | None:
    """``None`` once the exporter reads nginx's stub_status (``nginx_up 1``)."""
    status, body = _get(metrics_url)
    if status != 200:
        return f"{metrics_url} answered {status or 'nothing'}"
    return None if b"\nnginx_up 1" in body else f"{metrics_url}: nginx_up is not 1"


def site_of(endpoints: Endpoints) -> Site:
    """The nginx of a running cluster, from its endpoints."""
    url = urlsplit(endpoints.balancer_url)
    replicas = []
    for r in endpoints.replicas:
        u = urlsplit(r.url)
        replicas.append(
            ReplicaAddress(r.name, u.hostname or "127.0.0.1", u.port or 80, tuple(r.models), r.gpu)
        )
    return Site(
        state_dir=Path(endpoints.state_dir),
        host=url.hostname or "127.0.0.1",
        port=url.port or 80,
        replicas=tuple(replicas),
        models=tuple(endpoints.models),
        replica_header=endpoints.replica_header or DEFAULT_REPLICA_HEADER,
    )


class NginxBalancer(BalancerBase):
    """Open-source nginx 1.22 (no live API: every change is a graceful reload, so no live
    weights: the feedback agent is refused); routes by model, so any mix of models works."""

    name = "nginx"
    ansible_module = "lbtune_nginx"
    test_preset = "mini2-nginx"

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        site = Site(spec.state_dir, spec.host, spec.port, spec.replicas, spec.models)
        site.create()
        space = ParameterSpace.load(SPACE_FILE, replicas=[r.name for r in spec.replicas])
        try:
            params = space.complete(space.validate(spec.params, "params"), {})
        except ConfigError as exc:
            raise ConfigError(f"cluster YAML: {exc}") from None
        side = site.conf.with_name(site.conf.name + ".new")
        side.write_text(render_config(site, params), encoding="utf-8")
        problem = process.test_config(site, side)
        if problem is not None:
            raise ClusterError(f"nginx rejects the rendered config {side}: {problem}")
        os.replace(side, site.conf)
        link = site.prefix / PROGRAM_LINK
        link.unlink(missing_ok=True)
        link.symlink_to(process.binary())
        argv = [str(link), *process.argv(site)[1:]]
        supervisor.start(NGINX, argv)
        supervisor.wait_until(lambda: health_missing(site.url), START_TIMEOUT_S, "nginx /health")
        metrics_url = f"http://{spec.host}:{spec.metrics_port}/metrics"
        supervisor.start(
            NGINX_EXPORTER,
            [
                process.exporter_binary(),
                f"-nginx.scrape-uri=unix:{site.status_socket}:/stub_status",
                f"-web.listen-address={spec.host}:{spec.metrics_port}",
            ],
        )
        supervisor.wait_until(
            lambda: exporter_missing(metrics_url), START_TIMEOUT_S, "prometheus-nginx-exporter"
        )
        return BalancerLaunch(
            components=(NGINX, NGINX_EXPORTER),
            stats_url=metrics_url,
            metrics_url=metrics_url,
            details={"prefix": str(site.prefix), "conf": str(site.conf)},
        )

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return (ScrapeJob("nginx", (f"{spec.host}:{spec.metrics_port}",)),)

    def problems(self, endpoints: Endpoints) -> list[str]:
        site = site_of(endpoints)
        try:
            process.master(site)
        except TargetError as exc:
            return [str(exc)]
        found = [health_missing(site.url), exporter_missing(endpoints.balancer_metrics_url)]
        return [p for p in found if p is not None]

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """The live ``nginx.conf``'s servers and weights: open-source nginx reports no
        per-server state or connections (its exporter has only totals)."""
        try:
            live = self.target(endpoints).read_live()
        except (ConfigError, TargetError, OSError):
            return []
        rows = []
        for r in endpoints.replicas:
            weight = live.get(f"weight.{r.name}")
            if isinstance(weight, int):
                rows.append(ReplicaRow(r.name, "down" if weight == 0 else "in config", weight))
        return rows

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> NginxTarget:
        return NginxTarget(site_of(endpoints), space_file=space_file)


BALANCER = NginxBalancer()
