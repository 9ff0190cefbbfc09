"""``up()``, ``down()``, ``status()``: the embedded cluster as a library.

The CLI (``lbtune cluster ...``) and the ``stress``/``optimize`` commands call these.
``up`` starts the sim host and Prometheus, waits until every replica is healthy, asks
the cluster YAML's balancer (``balancer:``, a name of :data:`lbtune.targets.TARGETS`) to
launch itself (:meth:`~lbtune.targets.targetbase.BalancerBase.launch`: render, validate, start
under the supervisor, wait healthy), waits until Prometheus scrapes every replica and
the balancer's jobs, writes ``endpoints.json``, then, when the cluster YAML enables
it, starts the feedback agent (:mod:`lbtune.cluster.agent`) and, last, the keeper that
relaunches a dead balancer between commands (:mod:`lbtune.cluster.keeper`). When the
vLLM servers are pinned (``vllm.cpus``), everything else it starts runs on the other CPUs
(:mod:`lbtune.process.affinity`), and ``endpoints.json`` records theirs. If any step
fails, everything this ``up`` started is stopped again; ``down`` stops the keeper first,
then the agent, then every other recorded process in reverse start order. The cluster
never names a balancer.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune import targets
from lbtune.cluster import agent, heal, health, keeper, render, restore, vllm
from lbtune.cluster.config import DEFAULT_PRESET, LOOPBACK, ClusterConfig, load_config
from lbtune.cluster.health import ClusterStatus, ComponentStatus, ReplicaStatus
from lbtune.cluster.resolve import ResolvedCluster, check_ports, free_port, resolve
from lbtune.errors import BalancerDown, ClusterError
from lbtune.process import affinity, probes, supervisor
from lbtune.process.supervisor import ClusterSupervisor, ProcessRecord
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.records.statedir import (
    AGENT,
    KEEPER,
    PROMETHEUS,
    SIM,
    StatePaths,
    read_config_json,
    read_endpoints,
    state_dir_for,
    state_root,
    write_endpoints,
    write_json_atomic,
)
from lbtune.targets.base import BalancerLaunch, LaunchSpec, ReplicaAddress
from lbtune.targets.targetbase import BalancerBase

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

SIM_TIMEOUT = 30.0
PROMETHEUS_TIMEOUT = 20.0
HEAL_WAIT_S = 60.0
"""How long ``up`` waits for a relaunch the keeper is making (it then looks again)."""
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
    """Every process of the state dir, in start order (``down`` stops them in reverse)."""
    return supervisor.records(paths)


def _problems(ep: Endpoints, records: list[ProcessRecord]) -> list[str]:
    return health.problems(ep, records, targets.balancer(ep.balancer).problems)


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


def launch_spec(cluster: ResolvedCluster, paths: StatePaths, entry: BalancerBase) -> LaunchSpec:
    """What the balancer is told at launch (its extra ports picked free now)."""
    taken = {cluster.ports.balancer, cluster.ports.stats, *(r.port for r in cluster.replicas)}
    extra: dict[str, int] = {}
    for name in entry.extra_ports:
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        extra[name] = port
    return LaunchSpec(
        cluster_name=cluster.config.name,
        state_dir=paths.root,
        host=LOOPBACK,
        port=cluster.ports.balancer,
        metrics_port=cluster.ports.stats,
        extra_ports=extra,
        replicas=tuple(
            ReplicaAddress(r.name, r.host, r.port, tuple(r.models), r.gpu) for r in cluster.replicas
        ),
        models=tuple(cluster.models),
        params=dict(cluster.config.params),
        time_scale=cluster.config.time_scale,
        agent_settings=paths.agent_config if cluster.ports.agent is not None else None,
    )


def _endpoints(
    cluster: ResolvedCluster,
    paths: StatePaths,
    source: str,
    entry: BalancerBase,
    spec: LaunchSpec,
    launched: BalancerLaunch,
) -> Endpoints:
    p = cluster.ports
    return Endpoints(
        config_name=cluster.config.name,
        config_path=source,
        state_dir=str(paths.root),
        balancer=entry.name,
        balancer_url=f"http://{LOOPBACK}:{p.balancer}",
        stats_url=launched.stats_url,
        balancer_metrics_url=launched.metrics_url,
        balancer_components=list(launched.components),
        balancer_jobs=[j.job_name for j in entry.scrape_jobs(spec)],
        balancer_details=dict(launched.details),
        replica_header=entry.replica_header,
        prometheus_url=f"http://{LOOPBACK}:{p.prometheus}",
        exporter_port=p.exporter,
        exporter_url=f"http://{LOOPBACK}:{p.exporter}/metrics",
        prometheus_yml=str(paths.prometheus_yml),
        replicas=[
            ReplicaEndpoint(
                name=r.name, url=r.url, models=list(r.models), gpu=r.gpu, external=r.external
            )
            for r in cluster.replicas
        ],
        time_scale=cluster.config.time_scale,
        ground_truth_path=str(paths.ground_truth) if cluster.simulated else None,
        agent_config=str(paths.agent_config) if p.agent is not None else None,
        agent_metrics_url=f"http://{LOOPBACK}:{p.agent}/metrics" if p.agent is not None else None,
        reserved_cpus=cluster.config.reserved_cpus,
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
            return _already_up(cfg, paths, running, progress)
        for rec in _records(paths):  # stale PID files from a crash or a reboot
            supervisor.stop(rec, paths)
        entry = targets.balancer(cfg.balancer)
        prometheus = render.require("prometheus")
        cluster = resolve(cfg)
        check_ports(cluster, source)
        spec = launch_spec(cluster, paths, entry)
        if read_config_json(paths) != cfg.model_dump(mode="json"):
            restore.forget_last_known_good(paths.root)  # another cluster: starts untuned
        _write_configs(cluster, paths, entry, spec)
        started: list[ProcessRecord] = []
        try:
            ep = _start_all(cluster, paths, source, entry, spec, prometheus, started, progress)
        except BaseException:
            _say(progress, "start failed: stopping what was started")
            for rec in reversed(started):
                supervisor.stop(rec, paths)
            paths.endpoints.unlink(missing_ok=True)
            raise
        restore.restore_last_known_good(ep, lambda m: _say(progress, m))
        _say(progress, f"cluster {cfg.name} is up: {ep.balancer_url}")
        return ep


def _already_up(
    cfg: ClusterConfig, paths: StatePaths, running: list[ProcessRecord], progress: Progress | None
) -> Endpoints:
    where = f"--state-dir {paths.root}"
    if read_config_json(paths) != cfg.model_dump(mode="json"):
        raise ClusterError(
            f"A cluster with a different config is running in {paths.root}; "
            f"run `lbtune cluster down {where}` first"
        )
    ep = read_endpoints(paths)
    problems = ["endpoints.json is missing"] if ep is None else []
    if ep is not None:
        say = functools.partial(_say, progress)
        # only the balancer died: relaunched on its last known good (unless the keeper did)
        heal.heal_if_dead(paths, say, PROMETHEUS_TIMEOUT, HEAL_WAIT_S)
        problems = _problems(ep, _records(paths))
        if not problems:
            keeper.ensure_running(paths, say, affinity.complement(ep.reserved_cpus))
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


def _write_configs(
    cluster: ResolvedCluster, paths: StatePaths, entry: BalancerBase, spec: LaunchSpec
) -> None:
    write_json_atomic(paths.config, cluster.config.model_dump_json(indent=2) + "\n")
    jobs = entry.scrape_jobs(spec)
    paths.prometheus_yml.write_text(render.render_prometheus(cluster, jobs), encoding="utf-8")
    # A fresh start has no history: no old series, no agent settings (the last known good
    # of the same cluster is put back after the launch: lbtune.cluster.restore).
    paths.ground_truth.unlink(missing_ok=True)
    paths.agent_config.unlink(missing_ok=True)
    shutil.rmtree(paths.prometheus_data, ignore_errors=True)
    paths.prometheus_data.mkdir(parents=True, exist_ok=True)
    if cluster.simulated:
        spec_doc = render.sim_spec(cluster, paths)
        write_json_atomic(paths.sim_spec, spec_doc.model_dump_json(indent=2) + "\n")


def _start_all(
    cluster: ResolvedCluster,
    paths: StatePaths,
    source: str,
    entry: BalancerBase,
    spec: LaunchSpec,
    prometheus: str,
    started: list[ProcessRecord],
    progress: Progress | None,
) -> Endpoints:
    urls = {r.name: r.url for r in cluster.replicas}
    n = len(cluster.replicas)
    sim: list[ProcessRecord] = []
    others = vllm.other_cpus(cluster.config, functools.partial(_say, progress))
    if cluster.simulated:
        _say(progress, f"starting {n} simulated replicas")
        cmd = [sys.executable, "-m", "lbtune.sim", "--spec", str(paths.sim_spec)]
        sim.append(supervisor.start(SIM, cmd, paths, {"PYTHONUNBUFFERED": "1"}, others))
        started += sim
    if cluster.config.vllm is not None:
        _say(progress, f"starting {n} vLLM CPU servers (pinned to CPUs {cluster.config.vllm.cpus})")
        servers = vllm.start_servers(cluster, paths)  # each pins itself
        sim += servers
        started += servers
    # Prometheus applies its first target set only after ~5 s: start it early so that
    # this delay overlaps the replicas' and the balancer's start-up.
    _say(progress, "starting Prometheus")
    prom_cmd = [
        prometheus,
        f"--config.file={paths.prometheus_yml}",
        f"--storage.tsdb.path={paths.prometheus_data}",
        f"--web.listen-address={LOOPBACK}:{cluster.ports.prometheus}",
        "--web.enable-lifecycle",
    ]
    prom = supervisor.start(PROMETHEUS, prom_cmd, paths, cpus=others)
    started.append(prom)
    what = "the replicas' /health" if sim else "the external replicas' /health"
    timeout = vllm.STARTUP_TIMEOUT if cluster.config.vllm is not None else SIM_TIMEOUT
    supervisor.wait_until(lambda: health.replicas_missing(urls), timeout, what, [*sim, prom])
    _say(progress, f"starting {entry.name}")
    mine: list[ProcessRecord] = []
    heal.save_launch(paths, spec)
    try:
        launched = entry.launch(spec, ClusterSupervisor(paths, mine, [*sim, prom], others))
    finally:
        started += mine
    ep = _endpoints(cluster, paths, source, entry, spec, launched)
    _say(progress, "waiting for Prometheus to scrape every replica and the balancer")
    supervisor.wait_until(
        lambda: health.prometheus_missing(ep), PROMETHEUS_TIMEOUT, "Prometheus scrapes", started
    )
    write_endpoints(paths, ep)
    if ep.agent_config is not None:
        _say(progress, "starting the feedback agent")
        agent.write_config(cluster, paths)
        started.append(agent.start(paths, others))
        agent.wait_ready(ep, list(started))
    started.append(keeper.start(paths, others))  # last: nothing to keep before the rest is ready
    return ep


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
        for rec in _stop_order(paths):
            was_alive = supervisor.alive(rec)
            pids = supervisor.stop(rec, paths)
            if was_alive:
                _say(progress, f"stopped {rec.name} (pid {rec.pid})")
                stopped[rec.name] = pids
        paths.endpoints.unlink(missing_ok=True)
    return stopped


def _stop_order(paths: StatePaths) -> Iterator[ProcessRecord]:
    """What ``down`` stops, in order, lazily: the keeper first (it would relaunch the
    balancer being stopped); then, read once it is stopped (a balancer it relaunched
    meanwhile is newer than everything else), the agent (it would push weights to a
    balancer going away) and every other process in reverse start order."""
    own = supervisor.read_record(paths, KEEPER)
    if own is not None:
        yield own
    rest = [r for r in reversed(_records(paths)) if r.name != KEEPER]
    yield from sorted(rest, key=lambda r: r.name != AGENT)


def check_balancer(ep: Endpoints) -> None:
    """Raise :class:`BalancerDown` when a process the balancer runs as
    (``ep.balancer_components``) is no longer running, naming its log's last lines.
    Cheap (PID files and /proc only): a study asks it after a trial failed."""
    paths = StatePaths(Path(ep.state_dir))
    for rec in _records(paths):
        if rec.name in ep.balancer_components and not supervisor.alive(rec):
            code = supervisor.exited(rec)
            how = "" if code is None else f" (exit status {code})"
            raise BalancerDown(
                f"{ep.balancer}: {rec.name} (pid {rec.pid}) of the cluster in {paths.root} "
                f"is no longer running{how}; {rec.log} ends: {supervisor.log_tail(rec.log)}. "
                "Bring the cluster up again (lbtune cluster up), then lbtune optimize --resume"
            )


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
    problems = _problems(ep, records)
    replicas = []
    for r in ep.replicas:
        g = probes.scrape_gauges(r.url, _GAUGES, timeout=1.0)
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
