"""The static bootstrap Envoy starts with, and the one-file bootstrap ``envoy --mode
validate`` checks.

``bootstrap.json`` never changes while Envoy runs: admin on loopback, the API listener
(the OpenAI routes through a Lua filter that reads the body's ``model``, see :data:`LUA`),
and ``dynamic_resources`` pointing at the CDS file; the xDS files
(:mod:`lbtune.targets.envoy.config`) carry every knob. Before a structural change,
:func:`validation_bootstrap` puts all of them in one static config for Envoy's validator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lbtune.targets.base import ParamValue
from lbtune.targets.envoy.config import (
    LUA_FILTER,
    ROUTE_CONFIG,
    ROUTE_TIMEOUT,
    Layout,
    address,
    path_source,
    route_config,
    static_clusters,
)

__all__ = ["LUA", "bootstrap", "validation_bootstrap"]

LUA = """\
-- lbtune: model affinity and the consistent-hash key, from the request body.
function envoy_on_request(h)
  local headers = h:headers()
  headers:remove("x-lbtune-model")
  headers:remove("x-lbtune-prefix")
  if headers:get(":method") ~= "POST" then return end
  local body = h:body()
  if body == nil or body:length() == 0 then return end
  local text = body:getBytes(0, body:length())
  headers = h:headers()  -- a handle taken before body() is out of scope after it
  local model = string.match(text, '"model"%s*:%s*"([^"]*)"')
  if model ~= nil then headers:replace("x-lbtune-model", model) end
  local n = h:metadata():get("hash_bytes")
  if n ~= nil then
    local key = nil
    if headers:get(":path") == "/v1/completions" then
      key = string.match(text, '"prompt"%s*:%s*"(.-)"')
    end
    if key == nil then key = string.match(text, '"content"%s*:%s*"(.-)"') end
    if key ~= nil then
      key = string.gsub(string.sub(key, 1, n), "[^%w]", "_")
      headers:replace("x-lbtune-prefix", key)
    end
  end
  h:clearRouteCache()
end
"""


def _listener(layout: Layout, route_config: dict[str, Any] | None) -> dict[str, Any]:
    """The API listener; ``route_config`` inline (validation) or from RDS (live)."""
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "api",
        "stream_idle_timeout": ROUTE_TIMEOUT,
        "http_filters": [
            {
                "name": LUA_FILTER,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                    "default_source_code": {"inline_string": LUA},
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    if route_config is None:
        hcm["rds"] = {
            "route_config_name": ROUTE_CONFIG,
            "config_source": path_source(layout.path("rds.json")),
        }
    else:
        hcm["route_config"] = route_config
    return {
        "name": "api",
        "address": address(layout.host, layout.port),
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


def _base_bootstrap(layout: Layout) -> dict[str, Any]:
    return {
        "node": {"id": "lbtune", "cluster": "lbtune"},
        "admin": {"address": address(layout.host, layout.admin_port)},
        "layered_runtime": {"layers": [{"name": "static", "static_layer": {}}]},
    }


def bootstrap(layout: Layout) -> dict[str, Any]:
    """The bootstrap Envoy starts with: CDS and RDS from files in the config dir."""
    doc = _base_bootstrap(layout)
    doc["dynamic_resources"] = {"cds_config": path_source(layout.path("cds.json"))}
    doc["static_resources"] = {"listeners": [_listener(layout, None)]}
    return doc


def validation_bootstrap(layout: Layout, params: Mapping[str, ParamValue]) -> dict[str, Any]:
    """One static bootstrap holding what :func:`~lbtune.targets.envoy.config.render` splits
    over files (clusters with their endpoints inline, the routes inline):
    ``envoy --mode validate`` checks it all."""
    doc = _base_bootstrap(layout)
    doc["static_resources"] = {
        "listeners": [_listener(layout, route_config(layout, params))],
        "clusters": static_clusters(layout, params),
    }
    return doc
