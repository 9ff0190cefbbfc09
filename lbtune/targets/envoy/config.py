"""Envoy knobs → Envoy's file-based xDS: the clusters, their endpoints and the routes.

Files in the config dir (``<state>/envoy/``) beside the static ``bootstrap.json``
(:mod:`lbtune.targets.envoy.bootstrap`), each a ``DiscoveryResponse`` Envoy watches and
re-reads when it is replaced by rename:

- ``cds.json`` — one cluster per model (``model_<name>``: the replicas serving it) and
  ``all`` (every replica: ``/health`` and anything that is not a generate call); the
  structural knobs of the clusters (lb policy, circuit breakers, outlier detection,
  slow start) live here;
- ``eds-<cluster>.json`` — each cluster's endpoints and weights (the live knobs);
- ``rds.json`` — the routes: model affinity, retries, the consistent-hash key.

Model affinity works like HAProxy's ``use_backend`` on the body's model: the Lua filter
buffers a POST body, copies ``"model"`` into the ``x-lbtune-model`` header (and, when a
consistent hash is configured, the prompt prefix into ``x-lbtune-prefix``) and clears the
route cache; a route per (path, model) then picks the model's cluster, and an unknown
model gets a 404 from Envoy. Responses are never buffered (the Lua filter has no response
hook), so SSE chunks pass as they come.

Everything here is pure: params in, dicts out (:func:`render`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lbtune.targets.base import ParamValue, ReplicaAddress, pool_names

__all__ = [
    "ALL_CLUSTER",
    "GENERATE_PATHS",
    "LUA_FILTER",
    "MODEL_HEADER",
    "PREFIX_HEADER",
    "REPLICA_HEADER",
    "ROUTE_CONFIG",
    "ROUTE_TIMEOUT",
    "SESSION_HEADER",
    "Layout",
    "address",
    "dump",
    "members",
    "path_source",
    "render",
    "route_config",
    "static_clusters",
    "weights_of",
]

ALL_CLUSTER = "all"
ROUTE_CONFIG = "api"
GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")
MODEL_HEADER = "x-lbtune-model"
PREFIX_HEADER = "x-lbtune-prefix"
SESSION_HEADER = "x-session-id"
REPLICA_HEADER = "x-lbtune-replica"
METADATA_NS = "lbtune"
LUA_FILTER = "envoy.filters.http.lua"
ROUTE_TIMEOUT = "600s"
RUNTIME_PREFIX = "lbtune."
_TYPES = {
    "cluster": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "endpoints": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
    "routes": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
}


@dataclass(frozen=True)
class Layout:
    """Where one Envoy listens and what it fronts: everything rendering needs besides knobs."""

    config_dir: Path
    host: str
    port: int
    admin_port: int
    replicas: tuple[ReplicaAddress, ...]

    @property
    def models(self) -> list[str]:
        return sorted({m for r in self.replicas for m in r.models})

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def bootstrap_path(self) -> Path:
        return self.config_dir / "bootstrap.json"

    def path(self, name: str) -> Path:
        return self.config_dir / name


def members(layout: Layout) -> dict[str, list[ReplicaAddress]]:
    """Cluster name → its replicas (``all`` first)."""
    out = {ALL_CLUSTER: list(layout.replicas)}
    for model, cluster in pool_names(layout.models).items():
        out[cluster] = [r for r in layout.replicas if model in r.models]
    return out


def weights_of(params: Mapping[str, ParamValue], layout: Layout) -> dict[str, int]:
    """Replica → weight (``weight.<replica>``; 100 where absent)."""
    return {r.name: int(params.get(f"weight.{r.name}", 100)) for r in layout.replicas}


def _seconds(value: float) -> str:
    """A protobuf Duration (nanosecond resolution)."""
    return f"{value:.9f}".rstrip("0").rstrip(".") + "s"


def address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _response(kind: str, resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resources": [{"@type": _TYPES[kind], **r} for r in resources]}


def path_source(path: Path) -> dict[str, Any]:
    return {"resource_api_version": "V3", "path_config_source": {"path": str(path)}}


# ---------------------------------------------------------------------------------------
# Clusters (CDS) and endpoints (EDS).


def _runtime_double(value: float, key: str) -> dict[str, Any]:
    return {"default_value": value, "runtime_key": RUNTIME_PREFIX + key}


def _cluster(name: str, layout: Layout, p: Mapping[str, ParamValue]) -> dict[str, Any]:
    policy = str(p.get("lb_policy", "ROUND_ROBIN"))
    c: dict[str, Any] = {
        "name": name,
        # Envoy's Prometheus tags cut a cluster name at its first dot (model_llama-3.1-8b
        # became envoy_cluster_1_8b_..._upstream_rq_total{envoy_cluster_name="model_llama-3"}):
        # its stats go under a dotless name.
        "alt_stat_name": name.replace(".", "_"),
        "type": "EDS",
        "connect_timeout": "5s",
        "lb_policy": policy,
        "eds_cluster_config": {"eds_config": path_source(layout.path(f"eds-{name}.json"))},
        "health_checks": [
            {
                "timeout": "2s",
                "interval": "1s",
                "no_traffic_interval": "2s",
                "unhealthy_threshold": 3,
                "healthy_threshold": 2,
                "http_health_check": {"path": "/health"},
            }
        ],
        "circuit_breakers": {
            "thresholds": [
                {
                    "priority": "DEFAULT",
                    "max_connections": 1_000_000,
                    "max_requests": int(p.get("max_requests", 1024)),
                    "max_pending_requests": int(p.get("max_pending_requests", 1024)),
                    "max_retries": int(p.get("max_retries", 3)),
                }
            ]
        },
    }
    per_host = int(p.get("max_connections_per_host", 0))
    if per_host:
        c["circuit_breakers"]["per_host_thresholds"] = [{"max_connections": per_host}]
    slow = int(p.get("slow_start_s", 0))
    slow_start = {"slow_start_window": _seconds(slow)} if slow else None
    if policy == "LEAST_REQUEST":
        lr: dict[str, Any] = {
            "choice_count": int(p.get("choice_count", 2)),
            "active_request_bias": _runtime_double(
                float(p.get("active_request_bias", 1.0)), "active_request_bias"
            ),
        }
        if slow_start:
            lr["slow_start_config"] = slow_start
        c["least_request_lb_config"] = lr
    elif policy == "ROUND_ROBIN" and slow_start:
        c["round_robin_lb_config"] = {"slow_start_config": slow_start}
    elif policy in ("RING_HASH", "MAGLEV"):
        c["common_lb_config"] = {
            "consistent_hashing_lb_config": {
                "hash_balance_factor": int(p.get("hash_balance_factor", 150))
            }
        }
    if p.get("outlier_detection", False):
        c["outlier_detection"] = {
            "consecutive_5xx": int(p.get("outlier_consecutive_5xx", 5)),
            "base_ejection_time": _seconds(int(p.get("outlier_base_ejection_s", 30))),
            "max_ejection_percent": int(p.get("outlier_max_ejection_percent", 10)),
            "interval": _seconds(float(p.get("outlier_interval_s", 10.0))),
        }
    return c


def _assignment(name: str, reps: list[ReplicaAddress], weights: dict[str, int]) -> dict[str, Any]:
    endpoints = []
    for r in reps:
        w = weights.get(r.name, 100)
        ep: dict[str, Any] = {
            "endpoint": {"address": address(r.host, r.port), "hostname": r.name},
            "metadata": {"filter_metadata": {METADATA_NS: {"replica": r.name}}},
            # Envoy's weights are >= 1: weight 0 is "no new requests", i.e. draining.
            "load_balancing_weight": max(w, 1),
        }
        if w == 0:
            ep["health_status"] = "DRAINING"
        endpoints.append(ep)
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}


# ---------------------------------------------------------------------------------------
# Routes (RDS).


def _json_body(obj: object) -> dict[str, Any]:
    return {"inline_string": json.dumps(obj, separators=(",", ":"))}


def _action(cluster: str, p: Mapping[str, ParamValue]) -> dict[str, Any]:
    action: dict[str, Any] = {"cluster": cluster, "timeout": ROUTE_TIMEOUT}
    retries = int(p.get("retries", 0))
    if retries:
        action["retry_policy"] = {
            "retry_on": "connect-failure,refused-stream,retriable-status-codes",
            "retriable_status_codes": [429, 503],
            "num_retries": retries,
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host."
                        "previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            "host_selection_retry_max_attempts": 5,
        }
    if _hashing(p):
        policies: list[dict[str, Any]] = []
        if p.get("hash_key", "prefix") == "session":
            policies.append({"header": {"header_name": SESSION_HEADER}, "terminal": True})
        policies.append({"header": {"header_name": PREFIX_HEADER}})
        action["hash_policy"] = policies
    return action


def _hashing(p: Mapping[str, ParamValue]) -> bool:
    return str(p.get("lb_policy", "ROUND_ROBIN")) in ("RING_HASH", "MAGLEV")


def _route(
    match: dict[str, Any], action: dict[str, Any], p: Mapping[str, ParamValue]
) -> dict[str, Any]:
    route: dict[str, Any] = {"match": match, "route": action}
    if _hashing(p):
        route["metadata"] = {
            "filter_metadata": {LUA_FILTER: {"hash_bytes": int(p.get("hash_bytes", 256))}}
        }
    return route


def route_config(layout: Layout, p: Mapping[str, ParamValue]) -> dict[str, Any]:
    models = layout.models
    clusters = pool_names(models)
    routes: list[dict[str, Any]] = [
        {
            # Every replica lists only its own models: answer the union here.
            "match": {
                "path": "/v1/models",
                "headers": [{"name": ":method", "string_match": {"exact": "GET"}}],
            },
            "direct_response": {
                "status": 200,
                "body": _json_body(
                    {
                        "object": "list",
                        "data": [
                            {"id": m, "object": "model", "owned_by": "lbtune"} for m in models
                        ],
                    }
                ),
            },
        }
    ]
    for path in GENERATE_PATHS:
        for model, cluster in clusters.items():
            match = {
                "path": path,
                "headers": [{"name": MODEL_HEADER, "string_match": {"exact": model}}],
            }
            routes.append(_route(match, _action(cluster, p), p))
        routes.append(
            {
                "match": {"path": path, "headers": [{"name": MODEL_HEADER, "present_match": True}]},
                "direct_response": {
                    "status": 404,
                    "body": _json_body(
                        {
                            "error": {
                                "message": "The model is not served by this cluster. "
                                f"Served models: {', '.join(models)}",
                                "type": "invalid_request_error",
                                "param": "model",
                                "code": "model_not_found",
                            }
                        }
                    ),
                },
            }
        )
    routes.append(_route({"prefix": "/"}, _action(ALL_CLUSTER, p), p))
    return {
        "name": ROUTE_CONFIG,
        "virtual_hosts": [
            {
                "name": "api",
                "domains": ["*"],
                "response_headers_to_add": [
                    {
                        "header": {
                            "key": REPLICA_HEADER,
                            "value": f"%UPSTREAM_METADATA({METADATA_NS}:replica)%",
                        }
                    }
                ],
                "routes": routes,
            }
        ],
    }


# ---------------------------------------------------------------------------------------
# Everything at once.


def render(layout: Layout, params: Mapping[str, ParamValue]) -> dict[str, str]:
    """File name → text of every dynamic file (``cds.json``, ``rds.json``, ``eds-*.json``)."""
    pools = members(layout)
    weights = weights_of(params, layout)
    files = {
        "cds.json": dump(_response("cluster", [_cluster(n, layout, params) for n in pools])),
        "rds.json": dump(_response("routes", [route_config(layout, params)])),
    }
    for name, reps in pools.items():
        files[f"eds-{name}.json"] = dump(_response("endpoints", [_assignment(name, reps, weights)]))
    return files


def static_clusters(layout: Layout, params: Mapping[str, ParamValue]) -> list[dict[str, Any]]:
    """Every cluster with its endpoints inline (what :func:`render` splits over CDS and EDS
    files), for a static bootstrap."""
    weights = weights_of(params, layout)
    clusters = []
    for name, reps in members(layout).items():
        c = _cluster(name, layout, params)
        del c["eds_cluster_config"]
        c["type"] = "STATIC"
        c["load_assignment"] = _assignment(name, reps, weights)
        clusters.append(c)
    return clusters


def dump(doc: Mapping[str, Any]) -> str:
    """JSON (Envoy reads ``.json`` files natively; ~10x faster to write than YAML)."""
    return json.dumps(doc, indent=1) + "\n"
