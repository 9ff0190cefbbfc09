"""Read the knobs back from an ``nginx.conf``: the inverse of :mod:`lbtune.targets.nginx.config`.

Open-source nginx has no API that reports its upstreams, so the read-back parses the
file the running master loaded (lbtune replaces it only right before a confirmed reload,
and puts the previous one back when nginx refuses it). Parsed, not recorded: a knob that
did not make it into a directive does not read back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lbtune.errors import TargetError
from lbtune.targets.base import ParamSet, ReplicaAddress
from lbtune.targets.nginx.config import ALGORITHMS, ALL_UPSTREAM, RETRY_OVERLOAD

__all__ = ["parse_config", "upstream_block"]

_SERVER = re.compile(r"^\s*server\s+(\S+?):(\d+)((?:\s+[a-z_]+(?:=\S+?)?)*)\s*;", re.MULTILINE)
_OPTION = re.compile(r"([a-z_]+)(?:=(\S+))?")
_HASH_BYTES = re.compile(r"map \$request_body \$lbtune_prompt \{[^}]*?\{0,(\d+)\}", re.DOTALL)
_BY_DIRECTIVE = {v: k for k, v in ALGORITHMS.items() if v}


def upstream_block(text: str, name: str) -> str:
    """The body of ``upstream <name> { ... }`` (TargetError when the file has none)."""
    m = re.search(r"^\s*upstream\s+" + re.escape(name) + r"\s*\{(.*?)^\s*\}", text, re.M | re.S)
    if m is None:
        raise TargetError(f"nginx.conf has no `upstream {name}` block: not a config lbtune wrote")
    return m.group(1)


def _directive(text: str, name: str) -> str | None:
    """The last ``name`` directive's value (the route hop's come after the front's)."""
    found = re.findall(r"^\s*" + re.escape(name) + r"\s+([^;]*);", text, re.MULTILINE)
    return str(found[-1]).strip() if found else None


def _seconds(value: str) -> int:
    if value.endswith("s"):
        value = value[:-1]
    return int(value)


def parse_config(text: str, replicas: Sequence[ReplicaAddress]) -> ParamSet:
    """Every knob the file sets, from its directives: the ``all`` upstream's balancing
    method, servers and keepalive, the hash key's length, the route hop's retries."""
    out: ParamSet = {}
    block = upstream_block(text, ALL_UPSTREAM)
    method = next(
        (
            line.strip().rstrip(";")
            for line in block.splitlines()
            if line.strip().rstrip(";") in _BY_DIRECTIVE
        ),
        "",
    )
    out["algorithm"] = _BY_DIRECTIVE.get(method, "round_robin")
    by_addr = {(r.host, r.port): r.name for r in replicas}
    fails: set[int] = set()
    timeouts: set[int] = set()
    for host, port, opts in _SERVER.findall(block):
        name = by_addr.get((host, int(port)))
        if name is None:
            continue
        options = {k: v for k, v in _OPTION.findall(opts)}
        out[f"weight.{name}"] = 0 if "down" in options else int(options.get("weight") or 1)
        out[f"max_conns.{name}"] = int(options.get("max_conns") or 0)
        fails.add(int(options.get("max_fails") or 1))
        timeouts.add(_seconds(options.get("fail_timeout") or "10s"))
    if len(fails) == 1:
        out["max_fails"] = fails.pop()
    if len(timeouts) == 1:
        out["fail_timeout_s"] = timeouts.pop()
    keepalive = _directive(block, "keepalive")
    out["keepalive"] = int(keepalive) if keepalive else 0
    hash_bytes = _HASH_BYTES.search(text)
    if hash_bytes:
        out["hash_bytes"] = int(hash_bytes.group(1))
    retry = _directive(text, "proxy_next_upstream")
    out["retry_on_overload"] = retry == RETRY_OVERLOAD
    tries = _directive(text, "proxy_next_upstream_tries")
    if tries is not None:
        out["next_upstream_tries"] = int(tries)
    timeout = _directive(text, "proxy_next_upstream_timeout")
    if timeout is not None:
        out["next_upstream_timeout_s"] = _seconds(timeout)
    return out
