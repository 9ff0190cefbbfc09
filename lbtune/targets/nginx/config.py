"""nginx knobs → ``nginx.conf``: the site (where nginx listens, which replicas), and the render.

One source of truth per knob: every knob is a directive (or a server parameter) in the
rendered file, and :mod:`lbtune.targets.nginx.readback` reads the knobs back from the file
nginx loaded. Open-source nginx has no runtime API, so every knob is structural.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import pwd
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from lbtune.errors import ConfigError
from lbtune.targets.base import DEFAULT_REPLICA_HEADER, ParamValue, ReplicaAddress, pool_names

__all__ = [
    "ALGORITHMS",
    "ALL_UPSTREAM",
    "Site",
    "balance_directive",
    "next_upstream",
    "render_config",
    "template_context",
]

ALL_UPSTREAM = "all"
"""The upstream with every replica (requests without a ``model`` field: ``/health``...)."""
ALGORITHMS: dict[str, str] = {
    "round_robin": "",
    "least_conn": "least_conn",
    "random_two_least_conn": "random two least_conn",
    "hash": "hash $lbtune_prompt consistent",
}
"""Knob value → the upstream's balancing directive (round robin is nginx's default: none)."""
RETRY_BASE = "error timeout"
RETRY_OVERLOAD = "error timeout http_429 http_503 non_idempotent"
_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


@dataclass(frozen=True)
class Site:
    """One nginx lbtune runs: its listener, its replicas, its files under ``state_dir``.

    nginx's prefix (``-p``) is ``<state_dir>/nginx``: the config, nginx's own pid file,
    temp paths and the two unix sockets (``route.sock``, ``status.sock``) live there.
    """

    state_dir: Path
    host: str
    port: int
    replicas: tuple[ReplicaAddress, ...]
    models: tuple[str, ...]
    replica_header: str = DEFAULT_REPLICA_HEADER

    @property
    def prefix(self) -> Path:
        return self.state_dir / "nginx"

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def pid_file(self) -> Path:
        return self.prefix / "nginx.pid"

    @property
    def status_socket(self) -> Path:
        return self.prefix / "status.sock"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def create(self) -> None:
        """Make the prefix and its temp dirs; ConfigError when a socket path is too long.
        A socket file left by an nginx that was killed (only a clean exit removes it) is
        removed: nginx would not bind over it. Called before nginx starts."""
        for sock in ("route.sock", "status.sock"):
            if len(str(self.prefix / sock).encode()) > _SOCKET_MAX:
                raise ConfigError(
                    f"State dir path too long for nginx's unix sockets ({self.prefix / sock}); "
                    "use a shorter --state-dir"
                )
            (self.prefix / sock).unlink(missing_ok=True)
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)


def balance_directive(params: Mapping[str, ParamValue]) -> str:
    algorithm = str(params.get("algorithm", "round_robin"))
    if algorithm not in ALGORITHMS:  # pragma: no cover - the space refuses it first
        raise ConfigError(f"algorithm: {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm]


def next_upstream(params: Mapping[str, ParamValue]) -> str:
    """``proxy_next_upstream``'s conditions: 429/503 (sent POSTs included) when asked."""
    return RETRY_OVERLOAD if params.get("retry_on_overload", False) else RETRY_BASE


def _server_opts(name: str, params: Mapping[str, ParamValue]) -> str:
    weight = int(params.get(f"weight.{name}", 10))
    opts = f" weight={max(weight, 1)}"
    max_conns = int(params.get(f"max_conns.{name}", 0))
    if max_conns:
        opts += f" max_conns={max_conns}"
    opts += f" max_fails={int(params.get('max_fails', 1))}"
    opts += f" fail_timeout={int(params.get('fail_timeout_s', 10))}s"
    return opts + (" down" if weight == 0 else "")


def _address(host: str) -> str:
    """The IPv4 address nginx will show in ``$upstream_addr`` for ``host`` (it resolves
    names once, at load); ``host`` itself when it is an address or does not resolve."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _run_as() -> str:
    """``user`` directive value when nginx starts as root (workers would otherwise become
    ``nobody`` and could not reach the state dir); empty otherwise."""
    if os.geteuid() != 0:
        return ""
    return pwd.getpwuid(os.geteuid()).pw_name


def template_context(
    site: Site, params: Mapping[str, ParamValue], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Variables for ``nginx.conf.j2`` from a full parameter set."""
    names = pool_names(site.models)
    servers: list[dict[str, Any]] = [
        {
            "name": r.name,
            "address": r.host,
            "port": r.port,
            "models": list(r.models),
            "addr_regex": re.escape(f"{_address(r.host)}:{r.port}"),
            "opts": _server_opts(r.name, params),
        }
        for r in site.replicas
    ]
    upstreams = [{"name": ALL_UPSTREAM, "servers": servers}] + [
        {"name": names[m], "servers": [s for s in servers if m in s["models"]]} for m in site.models
    ]
    timeout = int(params.get("next_upstream_timeout_s", 0))
    ctx: dict[str, Any] = {
        "user": _run_as(),
        "prefix": str(site.prefix),
        "host": site.host,
        "port": site.port,
        "worker_processes": 1,
        "worker_connections": 4096,
        "log_level": "notice",
        "body_buffer": "1m",
        "connect_timeout": "5s",
        "read_timeout": "600s",
        "all_upstream": ALL_UPSTREAM,
        "models": [{"name": m, "upstream": names[m], "regex": re.escape(m)} for m in site.models],
        "servers": servers,
        "upstreams": [u for u in upstreams if u["servers"]],
        "balance": balance_directive(params),
        "hash_bytes": int(params.get("hash_bytes", 256)),
        "keepalive": int(params.get("keepalive", 32)),
        "next_upstream": next_upstream(params),
        "next_upstream_tries": int(params.get("next_upstream_tries", 0)),
        "next_upstream_timeout": f"{timeout}s" if timeout else "0",
        "replica_header": site.replica_header,
    }
    ctx.update(overrides or {})
    return ctx


@functools.cache
def _environment() -> jinja2.Environment:
    folder = importlib.resources.files(__package__ or "lbtune.targets.nginx")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_config(
    site: Site, params: Mapping[str, ParamValue], overrides: Mapping[str, Any] | None = None
) -> str:
    """``nginx.conf`` for ``params`` (a full set: see ParameterSpace.complete)."""
    try:
        template = _environment().get_template("nginx.conf.j2")
        return template.render(**template_context(site, params, overrides))
    except jinja2.TemplateError as exc:  # pragma: no cover - the template ships with us
        raise ConfigError(f"nginx.conf.j2: cannot render: {exc}") from None
