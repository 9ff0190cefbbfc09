"""The twin of the embedded cluster a capacity search (or a capacity study) simulates:
its replicas behind its balancer's routing model with a balancer config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lbtune.apply.paramfile import read_params_for
from lbtune.capacity.probes import TwinCase
from lbtune.cluster import api
from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.run.target import live_config
from lbtune.twin.fitted import TwinProfile

__all__ = ["twin_case"]


def twin_case(
    state_dir: Path | None,
    config: str | None = None,
    params: Path | Mapping[str, object] | None = None,
    profile: TwinProfile | None = None,
) -> TwinCase:
    """The twin of the cluster ``config`` (else the one running in ``state_dir``, else the
    default preset) behind its balancer's model, with ``params`` (a balancer param file,
    or a study's parameter set) over its baseline config or, without them, the config
    live on the running cluster. ConfigError (one line) when the twin has no model of the
    balancer. ``profile``: replicas fitted by ``lbtune twin fit`` are simulated from it."""
    ep = api.status(state_dir).endpoints
    ref = config or (ep.config_path if ep is not None else None)
    tc = twin_cluster(ref, profile=profile)
    layers: list[tuple[str, Mapping[str, object]]] = []
    if isinstance(params, Path):
        layers.append((str(params), read_params_for(params, tc.balancer)))
    elif params is not None:
        layers.append(("the study's parameters", params))
    values, _ = twin_params(tc, layers)
    tc.routing(values)  # the balancer has a model: else ConfigError
    if ep is not None and config is None and params is None:
        live, _ = live_config(ep)
        values.update({k: v for k, v in (live or {}).items() if k in values})
    options = tc.options()
    factory = tc.factory()
    return TwinCase(tc.replicas, lambda plan: factory(values, tc.replicas, seed=plan.seed), options)
