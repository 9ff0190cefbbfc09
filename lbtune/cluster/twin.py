"""The embedded cluster as the virtual-time twin sees it: its replicas as twin replicas, its
balancer's routing model, its parameter set.

The cluster sits above the targets and the twin in the layer order, so this is where a
cluster file (or a running cluster's recorded config) becomes what :mod:`lbtune.twin`
simulates::

    tc = twin_cluster("hetero4")                 # or running_twin(state_dir)
    params = twin_params(tc, [("--set", {"algorithm": "leastconn"})])
    model = tc.routing(params)                   # the balancer's own model
    run = simulate(plan, tc.replicas, model, tc.options())

The routing model is the balancer's (:meth:`~lbtune.targets.targetbase.BalancerBase.
routing_model`, which finds ``lbtune/targets/<name>/twin.py``); :class:`BalancerModel` names
it picklably for :class:`~lbtune.twin.pool.TwinPool` workers.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lbtune import targets
from lbtune.cluster.api import find_state_dir
from lbtune.cluster.config import ClusterConfig, load_config, parse_config
from lbtune.cluster.resolve import resolve
from lbtune.errors import ConfigError
from lbtune.records.statedir import StatePaths, read_config_json
from lbtune.targets.params import ParamSet
from lbtune.targets.space import ParameterSpace
from lbtune.twin.fitted import TwinProfile
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import Knobs, RoutingModel

__all__ = [
    "BalancerModel",
    "TwinCluster",
    "running_twin",
    "space_path",
    "twin_cluster",
    "twin_params",
]

_DELTA = re.compile(r"^(?P<group>[A-Za-z0-9_.-]*?)(?P<sign>[+-])(?P<n>\d+)$")
AGENT_NOTE = "agent.* knobs have no effect: this cluster runs no feedback agent"


@dataclass(frozen=True)
class BalancerModel:
    """The routing factory of balancer ``name`` (a :class:`~lbtune.twin.routing.
    RoutingFactory` that pickles as its name: a pool worker imports the balancer itself)."""

    name: str

    def __call__(
        self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0
    ) -> RoutingModel:
        return targets.balancer(self.name).routing_model(params, replicas, seed=seed)


@dataclass(frozen=True)
class TwinCluster:
    """A cluster file as the twin sees it."""

    config: ClusterConfig
    replicas: list[TwinReplica]
    source: str

    @property
    def balancer(self) -> str:
        return self.config.balancer

    def options(self, time_scale: float | None = None) -> TwinOptions:
        """The twin's settings for this cluster (its time scale and seed)."""
        scale = self.config.time_scale if time_scale is None else time_scale
        return TwinOptions(time_scale=scale, host_seed=self.config.seed)

    def factory(self) -> BalancerModel:
        return BalancerModel(self.config.balancer)

    def routing(self, params: Knobs, seed: int = 0) -> RoutingModel:
        """The balancer's routing model of ``params``; ConfigError when it has none."""
        return self.factory()(params, self.replicas, seed=seed)


def twin_cluster(
    ref: str | Path | None, delta: str | None = None, profile: TwinProfile | None = None
) -> TwinCluster:
    """The replicas of cluster ``ref`` (a preset or a file), named as ``lbtune cluster up``
    names them; ``delta`` changes them: ``+1``/``-1`` (the first replica group),
    ``GROUP+N``/``GROUP-N`` (by its name prefix, e.g. ``l4-1``) or another cluster file
    whose replicas replace them. A replica ``profile`` has fitted is simulated from its
    fit (:mod:`lbtune.twin.fitted`), any other from its GPU profile."""
    cfg, path = load_config(ref)
    source = str(path)
    if delta is not None:
        cfg, source = _changed(cfg, source, delta)
    return _of_config(cfg, source, profile)


def running_twin(
    state_dir: str | Path | None = None, profile: TwinProfile | None = None
) -> TwinCluster:
    """The cluster running in ``state_dir`` (its recorded config): ConfigError when none
    is recorded there. ``profile``: as :func:`twin_cluster`."""
    paths = StatePaths(find_state_dir(state_dir))
    data = read_config_json(paths)
    if data is None:
        raise ConfigError(f"twin: no cluster config recorded in {paths.root} (lbtune cluster up)")
    cfg = parse_config(data, str(paths.config))
    return _of_config(cfg, f"the cluster in {paths.root}", profile)


def _changed(cfg: ClusterConfig, source: str, delta: str) -> tuple[ClusterConfig, str]:
    m = _DELTA.match(delta.strip())
    if m is None:
        other, other_path = load_config(delta)
        cfg = cfg.model_copy(update={"replicas": other.replicas})
        return cfg, f"{source} with the replicas of {other_path}"
    groups = list(cfg.replicas)
    names = [g.prefix for g in groups]
    want = m["group"] or (names[0] if names else "")
    if want not in names:
        raise ConfigError(
            f"--replicas {delta}: no replica group {want!r}; groups: {', '.join(names)}"
        )
    i = names.index(want)
    n = groups[i].count + (int(m["n"]) if m["sign"] == "+" else -int(m["n"]))
    if n < 0:
        raise ConfigError(f"--replicas {delta}: group {want} has {groups[i].count}")
    groups[i] = groups[i].model_copy(update={"count": n})
    data = cfg.model_dump()
    data["replicas"] = [g.model_dump() for g in groups if g.count > 0]
    label = f"{source} with --replicas {delta}"
    return parse_config(data, label), label


def _of_config(cfg: ClusterConfig, source: str, profile: TwinProfile | None) -> TwinCluster:
    ports = itertools.count(1)
    resolved = resolve(cfg, pick_port=lambda: next(ports))
    fits = profile.by_name() if profile is not None else {}
    unknown = [r.name for r in resolved.replicas if r.external and r.name not in fits]
    if not resolved.replicas:
        raise ConfigError(f"{source}: no replicas to simulate")
    if unknown:
        raise ConfigError(
            f"{source}: the twin simulates simulated replicas and replicas fitted by "
            f"`lbtune twin fit`; {', '.join(unknown)} (external or real vLLM) have no fit: "
            "run `lbtune twin fit` on the running cluster and pass --twin-profile"
        )
    replicas = [
        TwinReplica(r.name, "", (fit.model,), fit=fit)
        if (fit := fits.get(r.name)) is not None
        else TwinReplica(r.name, r.gpu or "", r.models)
        for r in resolved.replicas
    ]
    return TwinCluster(cfg, replicas, source)


def space_path(balancer: str) -> Path:
    """The packaged ``space.yaml`` of ``balancer``."""
    entry = targets.TARGETS.get(balancer)
    if entry is None:
        raise targets.unknown(balancer, "balancer")
    module = importlib.import_module(entry.split(":", 1)[0])
    return Path(str(module.__file__)).with_name("space.yaml")


def twin_space(tc: TwinCluster, space_file: str | Path | None = None) -> ParameterSpace:
    """The balancer's space (``space_file``, else its packaged one) over ``tc``'s replicas."""
    path = space_file if space_file is not None else space_path(tc.balancer)
    return ParameterSpace.load(path, [r.name for r in tc.replicas])


def twin_params(
    tc: TwinCluster,
    overlays: Sequence[tuple[str, Mapping[str, object]]] = (),
    space: ParameterSpace | None = None,
) -> tuple[ParamSet, list[str]]:
    """The full parameter set: the balancer's baseline, the cluster's ``params``, then each
    overlay ``(source, values)`` in turn, each validated against the space (its source
    names it in an error); and notes (knobs without effect on this cluster, dropped)."""
    space = space or twin_space(tc)
    params = space.baseline()
    params.update(space.validate(tc.config.params, f"{tc.source}: params"))
    for source, values in overlays:
        params.update(space.validate(values, source))
    return drop_inactive(tc, params)


def drop_inactive(tc: TwinCluster, params: ParamSet) -> tuple[ParamSet, list[str]]:
    """``params`` without the knobs that have no effect on this cluster (the ``agent.*``
    knobs when it runs no feedback agent), and a note for each kind dropped."""
    out = dict(params)
    notes: list[str] = []
    if not tc.config.agent.enabled:
        agent = [k for k in out if k.startswith("agent.")]
        for k in agent:
            del out[k]
        if agent:
            notes.append(AGENT_NOTE)
    return out, notes
