"""HAProxy knobs → template variables, and which knobs are live for which algorithm.

One source of truth per knob: every knob, weights and maxconn included, is rendered into
``haproxy.cfg``; the live ones are *also* set through the runtime API so that they take
effect without a reload. A reload then starts from the same values the runtime holds.

- live (runtime API, no reload): ``weight.<server>`` while the algorithm is dynamic
  (roundrobin, leastconn, random, consistent hash — HAProxy refuses ``set weight`` with
  static ones), ``maxconn.<server>`` always;
- agent (``<state>/agent.yaml`` + SIGHUP to a running agent, no reload): ``agent.*``;
- structural (render, ``haproxy -c``, hitless reload): everything else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lbtune.resources import render_template
from lbtune.sim.profiles import GPU_PROFILES
from lbtune.targets.base import ParamValue, pool_names
from lbtune.targets.haproxy import llm
from lbtune.targets.haproxy.files import Site

__all__ = [
    "DYNAMIC_ALGORITHMS",
    "agent_settings",
    "is_live",
    "kind_of",
    "long_context_servers",
    "per_server",
    "render_config",
    "structure",
    "template_context",
]

DYNAMIC_ALGORITHMS = frozenset({"roundrobin", "leastconn", "random", "hash", "llm"})
"""Algorithms whose weights change at runtime (``hash`` is rendered ``hash-type consistent``)."""
LIVE_FAMILIES = ("weight", "maxconn")
AGENT_PREFIX = "agent."
LONG_CONTEXT_MEMORY_FRACTION = 0.9
"""Replicas with at least this fraction of the largest GPU memory form the long-context set."""
_RUNTIME_NUMBERS = re.compile(r" weight \d+( maxconn \d+)?")


def kind_of(knob: str, params: Mapping[str, ParamValue]) -> str:
    """``live``, ``agent`` or ``structural`` for ``knob`` under ``params``' algorithm."""
    if knob.startswith(AGENT_PREFIX):
        return "agent"
    if knob.startswith(llm.KNOB_PREFIX):
        return "live"  # the scheduler's map file + `set map` (lbtune/targets/haproxy/llm.py)
    return "live" if is_live(knob, params) else "structural"


def is_live(knob: str, params: Mapping[str, ParamValue]) -> bool:
    family = knob.split(".", 1)[0]
    if family == "maxconn" and "." in knob:
        return True
    if family == "weight" and "." in knob:
        return str(params.get("algorithm", "roundrobin")) in DYNAMIC_ALGORITHMS
    return False


def per_server(params: Mapping[str, ParamValue], family: str) -> dict[str, int]:
    """``{server: value}`` of a per-server family (``weight`` → ``weight.<server>``)."""
    prefix = family + "."
    return {k[len(prefix) :]: int(v) for k, v in params.items() if k.startswith(prefix)}


def long_context_servers(site: Site) -> list[str]:
    """The replicas with the largest KV cache: those whose GPU has at least 90 % of the
    largest GPU memory in the cluster (H100 80 GB and A100 80 GB, not L4 24 GB). Replicas
    of unknown GPUs count as long-context only when no replica's GPU is known."""
    memory = {
        r.name: GPU_PROFILES[r.gpu].memory_gib
        for r in site.replicas
        if r.gpu is not None and r.gpu in GPU_PROFILES
    }
    if not memory:
        return [r.name for r in site.replicas]
    top = max(memory.values())
    return [n for n, m in memory.items() if m >= LONG_CONTEXT_MEMORY_FRACTION * top]


def template_context(
    site: Site, params: Mapping[str, ParamValue], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Variables for ``lbtune/data/playbooks/templates/haproxy.cfg.j2`` from a full param set."""
    ctx: dict[str, Any] = site.context()
    weights, maxconn = per_server(params, "weight"), per_server(params, "maxconn")
    for s in ctx["haproxy_servers"]:
        if s["name"] in weights:
            s["weight"] = weights[s["name"]]
        if s["name"] in maxconn:
            s["maxconn"] = maxconn[s["name"]]
    algorithm = str(params.get("algorithm", "roundrobin"))
    if algorithm == "random":
        ctx["haproxy_balance"] = f"random({int(params.get('random_draws', 2))})"
    elif algorithm == llm.ALGORITHM:
        ctx["haproxy_balance"] = "leastconn"  # the scheduler's fallback
        ctx["haproxy_llm"] = llm.template_context(site.state_dir)
    elif algorithm == "hash":
        n = int(params.get("hash_bytes", 256))
        ctx["haproxy_balance"] = f"hash var(txn.lbtune_prompt),bytes(0,{n})"
        ctx["haproxy_hash_prompt"] = True
        ctx["haproxy_hash_type"] = "consistent"
        ctx["haproxy_hash_balance_factor"] = int(params.get("hash_balance_factor", 150))
    else:
        ctx["haproxy_balance"] = algorithm
    if "queue_timeout_s" in params:
        ctx["haproxy_timeout_queue"] = f"{int(params['queue_timeout_s'])}s"
    long_bytes = int(params.get("long_request_bytes", 0))
    if long_bytes:
        long_set = long_context_servers(site)
        ctx["haproxy_long_request_bytes"] = long_bytes
        ctx["haproxy_long_servers"] = long_set
        ctx["haproxy_long_models"] = [
            m
            for m in pool_names(site.models)
            if any(m in r.models for r in site.replicas if r.name in long_set)
        ]
    ctx.update(overrides or {})
    return ctx


def render_config(
    site: Site, params: Mapping[str, ParamValue], overrides: Mapping[str, Any] | None = None
) -> str:
    return render_template("haproxy.cfg.j2", template_context(site, params, overrides))


def render_untuned(site: Site) -> str:
    """The config of a fresh cluster: every knob at the template's default."""
    return render_template("haproxy.cfg.j2", site.context())


def structure(cfg_text: str) -> str:
    """The config without its runtime numbers (server weight/maxconn): two configs with the
    same structure differ only in what the runtime API can change without a reload."""
    return _RUNTIME_NUMBERS.sub("", cfg_text)


def agent_settings(params: Mapping[str, ParamValue]) -> dict[str, Any]:
    """The ``agent.*`` knobs of ``params`` as ``AgentConfig`` fields."""
    out: dict[str, Any] = {}
    out.update({k[len(AGENT_PREFIX) :]: v for k, v in params.items() if k.startswith(AGENT_PREFIX)})
    return out
