"""Which target a stress run loads, and whether it may: the embedded cluster (brought up
when it is not running) or a URL the user gave, checked before any load is sent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from lbtune.cluster import api
from lbtune.errors import ConfigError
from lbtune.loadgen.preflight import served_models
from lbtune.process import affinity
from lbtune.records.addresses import check_url, is_loopback
from lbtune.records.endpoints import Endpoints
from lbtune.targets import get_target
from lbtune.targets.lkg import LkgStore, params_hash

__all__ = [
    "ResolvedTarget",
    "TargetRequest",
    "check_reachable",
    "check_remote_options",
    "check_target_allowed",
    "live_config",
    "resolve_target",
    "target_facts",
]

log = logging.getLogger(__name__)


class TargetRequest(Protocol):
    """What target resolution reads of a run's options
    (:class:`lbtune.run.stress.StressOptions`)."""

    @property
    def target_url(self) -> str | None: ...
    @property
    def prometheus_url(self) -> str | None: ...
    @property
    def allow_remote(self) -> bool: ...
    @property
    def state_dir(self) -> Path | None: ...
    @property
    def cluster_config(self) -> str | None: ...
    @property
    def role(self) -> str: ...
    @property
    def master_host(self) -> str: ...
    @property
    def master_bind(self) -> str: ...


@dataclass(frozen=True)
class ResolvedTarget:
    url: str
    prometheus_url: str | None
    exporter_port: int | None
    endpoints: Endpoints | None
    cluster_started: bool
    models: set[str] | None = None
    """The models the target serves (its replicas', or its ``/v1/models``); None: unknown."""
    generator_cpus: frozenset[int] | None = None
    """Where the load generator's processes run: for an embedded cluster whose servers are
    pinned (``Endpoints.reserved_cpus``), the CPUs this process may use outside theirs;
    None: where this process runs (no pin, or no CPU would be left)."""


def check_target_allowed(url: str, allow_remote: bool) -> None:
    """Refuse load against a non-loopback host unless explicitly allowed, and a URL with
    credentials in it (:func:`lbtune.records.addresses.check_url`)."""
    check_url(url, "--target", allow_remote=allow_remote)


def check_remote_options(opts: TargetRequest) -> None:
    """Every option that opens lbtune to another machine needs ``allow_remote``: a master
    listening beyond loopback, a worker joining a remote master, a remote Prometheus
    (which may not carry credentials in its URL either)."""
    if opts.prometheus_url is not None:
        check_url(opts.prometheus_url, "--prometheus", allow_remote=True)  # its form
    if opts.allow_remote:
        return
    asks = []
    if opts.role == "master" and not is_loopback(opts.master_bind):
        asks.append(f"--master-bind {opts.master_bind} listens beyond loopback")
    if opts.role == "worker" and not is_loopback(opts.master_host):
        asks.append(f"--master-host {opts.master_host} is another machine")
    prom = urlsplit(opts.prometheus_url).hostname if opts.prometheus_url else None
    if opts.prometheus_url is not None and not is_loopback(prom):
        asks.append(f"--prometheus {opts.prometheus_url} is not on loopback")
    if asks:
        raise ConfigError("; ".join(asks) + ": that needs --allow-remote")


def check_reachable(url: str, timeout_s: float = 5.0) -> set[str] | None:
    """A real request to the target (``GET /v1/models``, never a bare TCP connect that a
    balancer counts as a failed request) within ``timeout_s``, or a TargetError saying so.
    Returns the models it lists (None: no model list)."""
    return served_models(url, timeout_s=timeout_s, tries=3)


def resolve_target(opts: TargetRequest, say: Callable[[str], None]) -> ResolvedTarget:
    """The URL to load, its Prometheus, and the exporter port the cluster scrapes."""
    if opts.target_url is not None:
        check_target_allowed(opts.target_url, opts.allow_remote)
        served = check_reachable(opts.target_url)
        url = opts.target_url.rstrip("/")
        return ResolvedTarget(url, opts.prometheus_url, None, None, False, served)
    st = api.status(opts.state_dir)
    started = False
    if st.running and st.endpoints is not None:
        endpoints = st.endpoints
    else:
        say("embedded cluster is not running: starting it (lbtune cluster up)")
        endpoints = api.up(opts.cluster_config, opts.state_dir, progress=say)
        started = True
    return ResolvedTarget(
        url=endpoints.balancer_url.rstrip("/"),
        prometheus_url=opts.prometheus_url or endpoints.prometheus_url,
        exporter_port=endpoints.exporter_port,
        endpoints=endpoints,
        cluster_started=started,
        models={m for r in endpoints.replicas for m in r.models},
        generator_cpus=affinity.complement(endpoints.reserved_cpus),
    )


def live_config(ep: Endpoints) -> tuple[dict[str, Any] | None, str | None]:
    """The embedded cluster's balancer config (params, sha256): what is live now (a study's
    trial config during its trial), else its last known good; ``(None, None)`` when neither
    can be read. ``run_stress`` records it in the run's plan (``run.json``) before the load."""
    balancer = getattr(ep, "balancer", "haproxy")
    try:
        live = dict(get_target(balancer, ep).read_live())
        return live, params_hash(live)
    except Exception as exc:
        log.debug("live config not read (%s)", exc)
    lkg = LkgStore(ep.state_dir, balancer).get()
    if lkg is not None:
        return dict(lkg.params), lkg.sha256
    return None, None


def target_facts(target: ResolvedTarget) -> tuple[str | None, str, dict[str, Any] | None]:
    """(balancer name, URL, live config) of the target, as far as lbtune knows them."""
    if target.endpoints is None:
        return None, target.url, None
    params, _ = live_config(target.endpoints)
    return getattr(target.endpoints, "balancer", None), target.url, params
