"""Envoy's live config → knobs: the inverse of :mod:`lbtune.targets.envoy.config`.

Reads what Envoy itself reports (``/config_dump`` for clusters and routes, ``/clusters``
for the endpoints' weights), not the files lbtune wrote. Only the knobs that shape the
live config can be read this way: a knob whose ``when`` does not hold (``choice_count``
under ROUND_ROBIN) leaves no trace in Envoy, so :func:`effective` omits it and the target
fills it from its record of what it last applied.

Envoy's dump omits fields at their proto default; the defaults below are Envoy's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lbtune.errors import TargetError
from lbtune.targets.base import ParamSet
from lbtune.targets.envoy.admin import HostState
from lbtune.targets.envoy.config import ALL_CLUSTER, LUA_FILTER, SESSION_HEADER

__all__ = ["cluster_knobs", "effective", "route_knobs", "weights"]

ENVOY_DEFAULT_THRESHOLDS = {"max_requests": 1024, "max_pending_requests": 1024, "max_retries": 3}


def _duration_s(text: object, default: float) -> float:
    if text is None:
        return default
    return float(str(text).rstrip("s"))


def cluster_knobs(cluster: Mapping[str, Any]) -> ParamSet:
    """The cluster knobs one Envoy cluster (``config_dump`` form) encodes."""
    out: ParamSet = {}
    policy = str(cluster.get("lb_policy", "ROUND_ROBIN"))
    out["lb_policy"] = policy
    breakers = cluster.get("circuit_breakers", {})
    thresholds = (breakers.get("thresholds") or [{}])[0]
    for knob, default in ENVOY_DEFAULT_THRESHOLDS.items():
        out[knob] = int(thresholds.get(knob, default))
    per_host = (breakers.get("per_host_thresholds") or [{}])[0]
    out["max_connections_per_host"] = int(per_host.get("max_connections", 0))
    if policy == "LEAST_REQUEST":
        lr = cluster.get("least_request_lb_config", {})
        out["choice_count"] = int(lr.get("choice_count", 2))
        out["active_request_bias"] = float(
            lr.get("active_request_bias", {}).get("default_value", 1.0)
        )
        slow = lr.get("slow_start_config", {}).get("slow_start_window")
        out["slow_start_s"] = int(_duration_s(slow, 0))
    elif policy == "ROUND_ROBIN":
        slow = (
            cluster.get("round_robin_lb_config", {})
            .get("slow_start_config", {})
            .get("slow_start_window")
        )
        out["slow_start_s"] = int(_duration_s(slow, 0))
    elif policy in ("RING_HASH", "MAGLEV"):
        chl = cluster.get("common_lb_config", {}).get("consistent_hashing_lb_config", {})
        out["hash_balance_factor"] = int(chl.get("hash_balance_factor", 0))
    od = cluster.get("outlier_detection")
    out["outlier_detection"] = od is not None
    if od is not None:
        out["outlier_consecutive_5xx"] = int(od.get("consecutive_5xx", 5))
        out["outlier_base_ejection_s"] = int(_duration_s(od.get("base_ejection_time"), 30))
        out["outlier_max_ejection_percent"] = int(od.get("max_ejection_percent", 10))
        out["outlier_interval_s"] = float(_duration_s(od.get("interval"), 10.0))
    return out


def route_knobs(route_config: Mapping[str, Any]) -> ParamSet:
    """The route knobs of the route config (the catch-all route to ``all`` is representative;
    every proxied route carries the same action)."""
    routes = [r for vh in route_config.get("virtual_hosts", []) for r in vh.get("routes", [])]
    proxied = [r for r in routes if r.get("route", {}).get("cluster") == ALL_CLUSTER]
    if not proxied:
        raise TargetError("Envoy's route config has no route to the `all` cluster")
    route = proxied[-1]
    action = route["route"]
    out: ParamSet = {"retries": int(action.get("retry_policy", {}).get("num_retries", 0))}
    hash_policy = action.get("hash_policy")
    if hash_policy:
        headers = [h.get("header", {}).get("header_name") for h in hash_policy]
        out["hash_key"] = "session" if SESSION_HEADER in headers else "prefix"
        meta = route.get("metadata", {}).get("filter_metadata", {}).get(LUA_FILTER, {})
        if "hash_bytes" in meta:
            out["hash_bytes"] = int(meta["hash_bytes"])
    return out


def weights(hosts: Iterable[HostState]) -> dict[str, int]:
    """Replica → live weight in the ``all`` cluster (DRAINING reads as 0)."""
    return {h.hostname: 0 if h.draining else h.weight for h in hosts if h.cluster == ALL_CLUSTER}


def effective(
    clusters: Sequence[Mapping[str, Any]], route_configs: Sequence[Mapping[str, Any]]
) -> tuple[ParamSet, list[str]]:
    """(knobs read from Envoy's live clusters and routes, disagreements between clusters).

    Every cluster is rendered with the same knobs; a cluster that says otherwise than
    ``all`` is reported (a half-applied CDS update)."""
    by_name = {c.get("name"): c for c in clusters}
    if ALL_CLUSTER not in by_name:
        raise TargetError("Envoy runs no `all` cluster (is this lbtune's Envoy?)")
    knobs = cluster_knobs(by_name[ALL_CLUSTER])
    odd = [str(n) for n, c in by_name.items() if cluster_knobs(c) != knobs]
    if len(route_configs) != 1:
        raise TargetError(f"Envoy has {len(route_configs)} dynamic route configs, expected 1")
    knobs.update(route_knobs(route_configs[0]))
    return knobs, odd
