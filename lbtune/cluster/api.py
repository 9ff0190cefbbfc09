"""``up()``, ``down()``, ``status()``: the embedded cluster as a library.

The CLI (``lbtune cluster ...``) and the ``stress``/``optimize`` commands call these.
``up`` starts the sim host, HAProxy and Prometheus (in that order, each only once the
previous one is ready), waits until every replica is healthy, every HAProxy server is
UP and Prometheus has scraped every replica, then, when the cluster YAML enables it,
starts the feedback agent (:mod:`lbtune.cluster.agent`), and writes ``endpoints.json``.
If any step fails, everything this ``up`` started is stopped again; ``down`` stops the
agent first. With ``balancer: vllm-router`` the router (:mod:`lbtune.cluster.router`)
takes HAProxy's place.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune.cluster import agent, health, probes, render, router, supervisor
from lbtune.cluster.config import (
    DEFAULT_PRESET,
    LOOPBACK,
    ClusterConfig,
    ResolvedCluster,
    load_config,
    resolve,
)
from lbtune.cluster.health import ClusterStatus, ComponentStatus, ReplicaStatus
from lbtune.cluster.state import (
    AGENT,
    COMPONENTS,
    Endpoints,
    ReplicaEndpoint,
    StatePaths,
    read_config_json,
    read_endpoints,
    state_dir_for,
    state_root,
    write_endpoints,
    write_json_atomic,
)
from lbtune.cluster.supervisor import ProcessRecord
from lbtune.errors import ClusterError

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

SIM_TIMEOUT = 30.0
HAPROXY_TIMEOUT = 15.0
PROMETHEUS_TIMEOUT = 20.0
_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


# ---------------------------------------------------------------------------------------
# Helpers.


def _say(progress: Progress | None, msg: str) -> None:
    (progress or log.info)(msg)


@contextmanager
def _locked(paths: StatePaths) -> Iterator[None]:
    """One ``up``/``down`` at a time per state dir."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(
                f"Another `lbtune cluster` command is working on {paths.root}; try again"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _records(paths: StatePaths) -> list[ProcessRecord]:
    names = (*COMPONENTS, router.COMPONENT, AGENT)  # down stops them in reverse: agent first
    return [r for n in names if (r := supervisor.read_record(paths, n)) is not None]


def _problems(ep: Endpoints, paths: StatePaths, records: list[ProcessRecord]) -> list[str]:
    simulated = any(not r.external for r in ep.replicas)
    if supervisor.read_record(paths, router.COMPONENT) is not None:
        return router.problems(ep, records, simulated)
    return health.problems(ep, records, simulated)


def find_state_dir(state_dir: str | Path | None = None) -> Path:
    """The state dir of ``down``/``status``: explicit, ``$LBTUNE_STATE_DIR``, or the one
    cluster running under the state root (several → an error listing them)."""
    if state_dir is not None:
        return state_dir_for("", state_dir)
    default = state_dir_for(DEFAULT_PRESET)
    if os.environ.get("LBTUNE_STATE_DIR"):
        return default
    live = sorted(
        d
        for d in state_root().glob("*")
        if d.is_dir() and any(supervisor.alive(r) for r in _records(StatePaths(d)))
    )
    if len(live) > 1:
        raise ClusterError(
            "Several clusters are running under "
            f"{state_root()}: {', '.join(d.name for d in live)}; pick one with --state-dir"
        )
    return live[0] if live else default


def _load(config: str | Path | ClusterConfig | None) -> tuple[ClusterConfig, str]:
    if isinstance(config, ClusterConfig):
        return config, "<in memory>"
    cfg, path = load_config(config)
    return cfg, str(path.resolve())


def _endpoints(cluster: ResolvedCluster, paths: StatePaths, source: str) -> Endpoints:
    p = cluster.ports
    stats = f"http://{LOOPBACK}:{p.stats}"
    return Endpoints(
        config_name=cluster.config.name,
        config_path=source,
        state_dir=str(paths.root),
        balancer_url=f"http://{LOOPBACK}:{p.balancer}",
        stats_url=f"{stats}/{'metrics' if cluster.config.balancer == 'vllm-router' else 'stats'}",
        haproxy_metrics_url=f"{stats}/metrics",
        prometheus_url=f"http://{LOOPBACK}:{p.prometheus}",
        exporter_port=p.exporter,
        exporter_url=f"http://{LOOPBACK}:{p.exporter}/metrics",
        runtime_socket=str(paths.runtime_socket),
        master_socket=str(paths.master_socket),
        server_state_file=str(paths.server_state),
        haproxy_cfg=str(paths.haproxy_cfg),
        prometheus_yml=str(paths.prometheus_yml),
        backends=render.backend_names(cluster.models),
        all_backend=render.ALL_BACKEND,
        replicas=[
            ReplicaEndpoint(
                name=r.name, url=r.url, models=list(r.models), gpu=r.gpu, external=r.external
            )
            for r in cluster.replicas
        ],
        time_scale=cluster.config.time_scale,
        ground_truth_path=str(paths.ground_truth) if cluster.simulated else None,
        balancer=cluster.config.balancer,
        agent_config=str(paths.agent_config) if p.agent is not None else None,
        agent_metrics_url=f"http://{LOOPBACK}:{p.agent}/metrics" if p.agent is not None else None,
    )


# ---------------------------------------------------------------------------------------
# up / down / status.


def up(
    config: str | Path | ClusterConfig | None = None,
    state_dir: str | Path | None = None,
    *,
    progress: Progress | None = None,
) -> Endpoints:
    """Start the cluster (or report the running one) and return its endpoints.

    ``config`` is a preset name (default ``hetero4``), a YAML path or a ClusterConfig.
    Raises ConfigError, DependencyError or ClusterError; on failure nothing is left running.
    """
    cfg, source = _load(config)
    paths = StatePaths(state_dir_for(cfg.name, state_dir))
    paths.create()
    with _locked(paths):
        running = [r for r in _records(paths) if supervisor.alive(r)]
        if running:
            return _already_up(cfg, paths, running)
        for rec in _records(paths):  # stale PID files from a crash or a reboot
            supervisor.stop(rec, paths)
        use_router = cfg.balancer == "vllm-router"
        haproxy = "" if use_router else render.require("haproxy")
        prometheus = render.require("prometheus")
        cluster = resolve(cfg)
        _check_ports(cluster, source)
        ep = _endpoints(cluster, paths, source)
        _write_configs(cluster, paths)
        started: list[ProcessRecord] = []
        try:
            _start_all(cluster, paths, ep, haproxy, prometheus, started, progress)
            write_endpoints(paths, ep)
        except BaseException:
            _say(progress, "start failed: stopping what was started")
            for rec in reversed(started):
                supervisor.stop(rec, paths)
            paths.endpoints.unlink(missing_ok=True)
            raise
        _say(progress, f"cluster {cfg.name} is up: {ep.balancer_url}")
        return ep


def _already_up(cfg: ClusterConfig, paths: StatePaths, running: list[ProcessRecord]) -> Endpoints:
    where = f"--state-dir {paths.root}"
    if read_config_json(paths) != cfg.model_dump(mode="json"):
        raise ClusterError(
            f"A cluster with a different config is running in {paths.root}; "
            f"run `lbtune cluster down {where}` first"
        )
    ep = read_endpoints(paths)
    problems = ["endpoints.json is missing"] if ep is None else []
    if ep is not None:
        problems = _problems(ep, paths, _records(paths))
    if problems or ep is None:
        raise ClusterError(
            f"Cluster {cfg.name} in {paths.root} is running but unhealthy "
            f"({'; '.join(problems)}); run `lbtune cluster down {where}` and up again"
        )
    log.info(
        "cluster %s already up in %s (pids %s)",
        cfg.name,
        paths.root,
        ", ".join(str(r.pid) for r in running),
    )
    return ep


def _check_ports(cluster: ResolvedCluster, source: str) -> None:
    p = cluster.ports
    wanted = [
        ("balancer", p.balancer),
        ("stats", p.stats),
        ("prometheus", p.prometheus),
        ("exporter", p.exporter),
        *([("agent", p.agent)] if p.agent is not None else []),
    ] + [(f"replica {r.name}", r.port) for r in cluster.simulated]
    for what, port in wanted:
        if probes.port_busy(LOOPBACK, port):
            field = "replica_base" if what.startswith("replica") else what
            raise ClusterError(
                f"Port {port} ({what}) is already in use on {LOOPBACK}; stop what listens "
                f"there, or change ports.{field} in {source} (or use `ports: auto`)"
            )


def _write_configs(cluster: ResolvedCluster, paths: StatePaths) -> None:
    write_json_atomic(paths.config, cluster.config.model_dump_json(indent=2) + "\n")
    if cluster.config.balancer == "vllm-router":
        paths.prometheus_yml.write_text(router.render_prometheus(cluster), encoding="utf-8")
    else:
        paths.haproxy_cfg.write_text(render.render_haproxy(cluster, paths), encoding="utf-8")
        render.validate_haproxy(paths.haproxy_cfg)
        paths.prometheus_yml.write_text(render.render_prometheus(cluster), encoding="utf-8")
    # A fresh start is untuned and has no history: no saved weights, no old series.
    paths.server_state.unlink(missing_ok=True)
    paths.ground_truth.unlink(missing_ok=True)
    paths.agent_config.unlink(missing_ok=True)
    # ... and no last known good: the one of an earlier incarnation describes a balancer
    # that no longer runs (its history file stays, for the record).
    for current in (paths.root / "lkg").glob("*.json"):
        current.unlink(missing_ok=True)
    if cluster.ports.agent is not None:
        agent.write_config(cluster, paths)
    shutil.rmtree(paths.prometheus_data, ignore_errors=True)
    paths.prometheus_data.mkdir(parents=True, exist_ok=True)
    if cluster.simulated:
        spec = render.sim_spec(cluster, paths)
        write_json_atomic(paths.sim_spec, spec.model_dump_json(indent=2) + "\n")


def _start_all(
    cluster: ResolvedCluster,
    paths: StatePaths,
    ep: Endpoints,
    haproxy: str,
    prometheus: str,
    started: list[ProcessRecord],
    progress: Progress | None,
) -> None:
    urls = {r.name: r.url for r in cluster.replicas}
    n = len(cluster.replicas)
    sim: list[ProcessRecord] = []
    if cluster.simulated:
        _say(progress, f"starting {n} simulated replicas")
        cmd = [sys.executable, "-m", "lbtune.sim", "--spec", str(paths.sim_spec)]
        sim.append(supervisor.start("sim", cmd, paths, env={"PYTHONUNBUFFERED": "1"}))
        started += sim
    # Prometheus applies its first target set only after ~5 s: start it early so that
    # this delay overlaps the replicas' and HAProxy's start-up.
    _say(progress, "starting Prometheus")
    prom_cmd = [
        prometheus,
        f"--config.file={paths.prometheus_yml}",
        f"--storage.tsdb.path={paths.prometheus_data}",
        f"--web.listen-address={LOOPBACK}:{cluster.ports.prometheus}",
        "--web.enable-lifecycle",
    ]
    prom = supervisor.start("prometheus", prom_cmd, paths)
    started.append(prom)
    what = "the replicas' /health" if sim else "the external replicas' /health"
    supervisor.wait_until(lambda: health.replicas_missing(urls), SIM_TIMEOUT, what, [*sim, prom])
    if cluster.config.balancer == "vllm-router":
        _say(progress, "starting vllm-router")
        started.append(router.start(paths, router.cluster_command(cluster), watch=sim))
        _say(progress, "waiting for Prometheus to scrape every replica")
        supervisor.wait_until(
            lambda: router.prometheus_missing(ep),
            PROMETHEUS_TIMEOUT,
            "Prometheus scrapes",
            [*sim, started[-1], prom],
        )
        return
    _say(progress, "starting HAProxy")
    hap_cmd = [haproxy, "-W", "-S", str(paths.master_socket), "-f", str(paths.haproxy_cfg)]
    hap = supervisor.start("haproxy", hap_cmd, paths)
    started.append(hap)
    supervisor.wait_until(
        lambda: health.haproxy_missing(ep), HAPROXY_TIMEOUT, "HAProxy servers UP", [*sim, hap]
    )
    _say(progress, "waiting for Prometheus to scrape every replica")
    supervisor.wait_until(
        lambda: health.prometheus_missing(ep),
        PROMETHEUS_TIMEOUT,
        "Prometheus scrapes",
        [*sim, hap, prom],
    )
    if ep.agent_config is not None:
        _say(progress, "starting the feedback agent")
        started.append(agent.start(paths))
        agent.wait_ready(ep, [*sim, hap, prom, started[-1]])


def down(
    state_dir: str | Path | None = None, *, progress: Progress | None = None
) -> dict[str, list[int]]:
    """Stop what ``up`` started (by PID, verified); return the PIDs signalled per component.

    Idempotent: with nothing running it returns ``{}``.
    """
    paths = StatePaths(find_state_dir(state_dir))
    if not paths.root.is_dir():
        return {}
    stopped: dict[str, list[int]] = {}
    with _locked(paths):
        for rec in reversed(_records(paths)):
            was_alive = supervisor.alive(rec)
            pids = supervisor.stop(rec, paths)
            if was_alive:
                _say(progress, f"stopped {rec.name} (pid {rec.pid})")
                stopped[rec.name] = pids
        paths.endpoints.unlink(missing_ok=True)
        for sock in (paths.runtime_socket, paths.master_socket):
            sock.unlink(missing_ok=True)
    return stopped


def status(state_dir: str | Path | None = None) -> ClusterStatus:
    """Health and per-replica load of the cluster in ``state_dir`` (never raises if down)."""
    paths = StatePaths(find_state_dir(state_dir))
    records = _records(paths)
    components = [
        ComponentStatus(name=r.name, pid=r.pid, running=supervisor.alive(r), log=r.log)
        for r in records
    ]
    running = any(c.running for c in components)
    ep = read_endpoints(paths) if running else None
    if ep is None:
        problems = ["not running"] if not running else ["endpoints.json is missing"]
        return ClusterStatus(
            state_dir=str(paths.root),
            running=running,
            healthy=False,
            endpoints=None,
            components=components,
            replicas=[],
            problems=problems,
        )
    problems = _problems(ep, paths, records)
    try:
        servers = probes.haproxy_servers(ep.runtime_socket)
    except OSError:
        servers = []
    replicas = []
    for r in ep.replicas:
        g = probes.scrape_gauges(r.url, _GAUGES, timeout=1.0)
        mine = [s for s in servers if s.server == r.name]
        in_all = [s for s in mine if s.backend == ep.all_backend]
        replicas.append(
            ReplicaStatus(
                name=r.name,
                url=r.url,
                gpu=r.gpu,
                models=r.models,
                healthy=probes.healthy(r.url, timeout=1.0),
                running=g.get(_GAUGES[0]),
                waiting=g.get(_GAUGES[1]),
                kv_usage=g.get(_GAUGES[2]),
                haproxy_status=in_all[0].status if in_all else None,
                sessions=sum(s.sessions for s in mine) if mine else None,
            )
        )
    return ClusterStatus(
        state_dir=str(paths.root),
        running=True,
        healthy=not problems,
        endpoints=ep,
        components=components,
        replicas=replicas,
        problems=problems,
    )
