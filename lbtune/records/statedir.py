"""The cluster's state dir: where its files live, and the endpoints record in it.

Layout of a state dir (default ``$LBTUNE_STATE_DIR``, else
``$XDG_STATE_HOME/lbtune/<cluster>`` or ``~/.local/state/lbtune/<cluster>``)::

    config.json          the validated cluster config `up` ran with
    endpoints.json       balancer/Prometheus/replica URLs (see Endpoints)
    sim.json             the HostSpec given to `python -m lbtune.sim`
    prometheus.yml       rendered from lbtune/data/playbooks/templates/prometheus.yml.j2
    prometheus-data/     Prometheus TSDB
    ground_truth.jsonl   the sim's per-request server-side timestamps
    agent.yaml           the feedback agent's settings (when the cluster YAML enables it)
    lkg/                 lbtune.apply's last known good per target
    launch.json          what the balancer was launched with (lbtune.cluster.heal)
    calibration.json     each replica's measured engine rates (lbtune cluster calibrate)
    <component>.pid      one JSON record per started process (sim, prometheus, the
                         balancer's components, agent, keeper)
    logs/<component>.log
    ...                  the balancer's own files (its config, sockets): its target
                         subpackage documents them (e.g. haproxy.cfg, haproxy.sock)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lbtune.errors import ClusterError, ConfigError
from lbtune.records.endpoints import Endpoints
from lbtune.safety.files import MAX_DOCUMENT_BYTES, check_out_dir, read_text

SIM = "sim"
PROMETHEUS = "prometheus"
AGENT = "agent"
"""The feedback agent's component name (``agent.pid``, ``logs/agent.log``)."""
KEEPER = "keeper"
"""The keeper's component name (``keeper.pid``, ``logs/keeper.log``): it relaunches a
dead balancer between commands (:mod:`lbtune.cluster.keeper`)."""


def state_root() -> Path:
    """Where state dirs of named clusters live."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "lbtune"


def state_dir_for(name: str, explicit: str | Path | None = None) -> Path:
    """The state dir: ``explicit``, else ``$LBTUNE_STATE_DIR``, else the root + name; a path
    that is a file, a device, empty text or holds control characters is one ConfigError
    line naming it (:func:`lbtune.safety.files.check_out_dir`)."""
    if explicit is not None:
        where, path = "--state-dir", str(explicit)
    elif os.environ.get("LBTUNE_STATE_DIR") is not None:
        where, path = "LBTUNE_STATE_DIR", os.environ["LBTUNE_STATE_DIR"]
        if not path:
            return state_root() / name  # set but empty: unset
    else:
        return state_root() / name
    check_out_dir(path, where, fresh=False, writable=False)
    return Path(path).expanduser().absolute()


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Every file of one state dir."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.json"

    @property
    def launch(self) -> Path:
        """What the balancer was launched with (``lbtune.cluster.heal`` relaunches it)."""
        return self.root / "launch.json"

    @property
    def calibration(self) -> Path:
        """Each replica's measured engine rates (:mod:`lbtune.records.calibration`)."""
        return self.root / "calibration.json"

    @property
    def sim_spec(self) -> Path:
        return self.root / "sim.json"

    @property
    def prometheus_yml(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def prometheus_data(self) -> Path:
        return self.root / "prometheus-data"

    @property
    def ground_truth(self) -> Path:
        return self.root / "ground_truth.jsonl"

    @property
    def agent_config(self) -> Path:
        return self.root / "agent.yaml"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def apply_lock(self) -> Path:
        """Held by an apply or a rollback (:mod:`lbtune.apply.lock`), and by a relaunch while
        it puts the last known good back."""
        return self.root / "apply.lock"

    @property
    def heal_lock(self) -> Path:
        """Held while the balancer is relaunched: by ``up`` or by the keeper, never both."""
        return self.root / ".heal.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def pid_file(self, component: str) -> Path:
        return self.root / f"{component}.pid"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def create(self) -> None:
        """Create the dirs."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prometheus_data.mkdir(parents=True, exist_ok=True)


def write_json_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_endpoints(paths: StatePaths, endpoints: Endpoints) -> None:
    write_json_atomic(paths.endpoints, endpoints.model_dump_json(indent=2) + "\n")


def read_endpoints(paths: StatePaths) -> Endpoints | None:
    """The endpoints of the cluster in ``paths``, or ``None`` when there are none."""
    if not paths.endpoints.exists():
        return None
    try:
        return Endpoints.model_validate_json(
            read_text(paths.endpoints, max_bytes=MAX_DOCUMENT_BYTES)
        )
    except (ValueError, ConfigError) as exc:
        raise ClusterError(
            f"{paths.endpoints} is unreadable ({exc.__class__.__name__}); "
            f"run `lbtune cluster down --state-dir {paths.root}`"
        ) from None


def read_config_json(paths: StatePaths) -> object | None:
    if not paths.config.exists():
        return None
    try:
        data: object = json.loads(read_text(paths.config, max_bytes=MAX_DOCUMENT_BYTES))
        return data
    except (ValueError, ConfigError, RecursionError):
        return None
