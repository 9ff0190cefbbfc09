"""The feedback agent as a component of the embedded cluster (``agent.enabled`` in its YAML).

``up`` writes ``<state>/agent.yaml`` (:func:`settings`: the cluster's Prometheus and
state dir — the agent steers that cluster's balancer through its registry entry's live
weights —, ``ports.agent`` for the agent's ``/metrics``, a 1 s interval, a TTFT
ceiling scaled by the time scale, then the YAML's ``agent.settings``), and once the
balancer and Prometheus are ready starts ``python -m lbtune agent run --config
<state>/agent.yaml`` like any other component (``agent.pid``, ``logs/agent.log``,
identity-checked stops). A target's ``agent.*`` knobs (HAProxy's) rewrite the same file
and SIGHUP the same PID.
While the agent runs with ``enabled: true`` it owns the per-server weights.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from typing import Any

from lbtune.agent.config import write_agent_file
from lbtune.cluster import health
from lbtune.cluster.config import LOOPBACK
from lbtune.cluster.resolve import ResolvedCluster
from lbtune.errors import ConfigError
from lbtune.process import supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import AGENT, StatePaths

__all__ = ["AGENT_TIMEOUT", "settings", "start", "wait_ready", "write_config"]

AGENT_TIMEOUT = 15.0
INTERVAL_S = 1.0
"""One step per Prometheus scrape (the cluster scrapes every second)."""
TTFT_CEILING_S = 1.0
"""AgentConfig's default ceiling in the replicas' own seconds; divided by the time scale."""


def settings(cluster: ResolvedCluster, paths: StatePaths) -> dict[str, Any]:
    """The contents of ``agent.yaml``: the cluster's wiring, then ``agent.settings``."""
    cfg = cluster.config
    out: dict[str, Any] = {
        "prometheus_url": f"http://{LOOPBACK}:{cluster.ports.prometheus}",
        "state_dir": str(paths.root),
        "metrics_port": cluster.ports.agent,
        "interval_s": INTERVAL_S,
        # The sim reports times divided by its time scale: so must the ceiling be.
        "ttft_ceiling_s": round(TTFT_CEILING_S / cfg.time_scale, 6),
    }
    out.update(cfg.agent.settings)
    return out


def write_config(cluster: ResolvedCluster, paths: StatePaths) -> None:
    try:
        write_agent_file(paths.agent_config, settings(cluster, paths))
    except ConfigError as exc:  # e.g. settings that clash with the cluster's defaults
        raise ConfigError(f"cluster {cluster.config.name!r}: agent.settings: {exc}") from None


def command(paths: StatePaths) -> list[str]:
    return [sys.executable, "-m", "lbtune", "agent", "run", "--config", str(paths.agent_config)]


def start(paths: StatePaths, cpus: Collection[int] | None = None) -> ProcessRecord:
    """Start the agent, on ``cpus`` when given (its PID file is written before this returns)."""
    env = {
        "LBTUNE_STATE_DIR": str(paths.root),  # its defaults come from this cluster, no scan
        "PYTHONUNBUFFERED": "1",
        "NO_COLOR": "1",
        "COLUMNS": "200",  # its log lines are not wrapped at 80 columns
    }
    return supervisor.start(AGENT, command(paths), paths, env=env, cpus=cpus)


def wait_ready(ep: Endpoints, watch: Sequence[ProcessRecord]) -> None:
    """Wait until the agent serves ``/metrics`` and Prometheus has scraped it."""
    supervisor.wait_until(
        lambda: health.agent_missing(ep),
        AGENT_TIMEOUT,
        "the agent's /metrics and its Prometheus scrape",
        watch,
    )
