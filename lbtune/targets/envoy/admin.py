"""Envoy's admin API (loopback): hosts and weights (``/clusters``), the live config
(``/config_dump``), readiness (``/ready``), and the ``/server_info`` epoch.

One client for every reader (the target's read-back, the cluster's health check, the
feedback agent's weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from lbtune.errors import TargetError

__all__ = ["EnvoyAdmin", "HostState"]


@dataclass(frozen=True)
class HostState:
    """One host of one cluster, as ``/clusters?format=json`` reports it."""

    cluster: str
    hostname: str
    address: str
    weight: int
    draining: bool
    """EDS health status DRAINING (what weight 0 renders)."""
    healthy: bool
    """No failure flag set (active health check, outlier ejection, EDS status)."""
    active: int = 0
    """``rq_active``: requests open to this host in this cluster now."""


class EnvoyAdmin:
    """``EnvoyAdmin("http://127.0.0.1:PORT")``."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> str:
        try:
            with urlopen(self.url + path, timeout=self.timeout) as resp:
                body: bytes = resp.read()
                return body.decode()
        except HTTPError as exc:
            raise TargetError(f"Envoy admin {self.url}{path} answered {exc.code}") from None
        except (URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TargetError(f"Envoy admin {self.url} not reachable ({reason})") from None

    def get_json(self, path: str) -> Any:
        text = self.get(path)
        try:
            return json.loads(text)
        except ValueError:
            raise TargetError(f"Envoy admin {self.url}{path} did not answer JSON") from None

    def ready(self) -> bool:
        try:
            return self.get("/ready").strip() == "LIVE"
        except TargetError:
            return False

    def hosts(self) -> list[HostState]:
        """Every host of every cluster."""
        data = self.get_json("/clusters?format=json")
        out: list[HostState] = []
        for c in data.get("cluster_statuses", []):
            for h in c.get("host_statuses", []):
                health: dict[str, Any] = h.get("health_status", {})
                eds = health.get("eds_health_status", "HEALTHY")
                flags = [k for k, v in health.items() if k != "eds_health_status" and v is True]
                sock = h.get("address", {}).get("socket_address", {})
                stats = {st.get("name"): st.get("value", 0) for st in h.get("stats", [])}
                out.append(
                    HostState(
                        cluster=c["name"],
                        hostname=h.get("hostname", ""),
                        address=f"{sock.get('address')}:{sock.get('port_value')}",
                        weight=int(h.get("weight", 1)),
                        draining=eds == "DRAINING",
                        healthy=not flags and eds in ("HEALTHY", "DRAINING"),
                        active=int(stats.get("rq_active", 0)),
                    )
                )
        return out

    def config_dump(self, resource: str) -> list[dict[str, Any]]:
        """The ``configs`` entries of ``/config_dump?resource=<resource>`` (e.g.
        ``dynamic_active_clusters``, ``dynamic_warming_clusters``, ``dynamic_route_configs``)."""
        data = self.get_json(f"/config_dump?resource={resource}")
        configs: list[dict[str, Any]] = data.get("configs", [])
        return configs

    def epoch_uptime(self) -> tuple[int, int]:
        """(hot-restart epoch, seconds since this epoch started): a restart shows here."""
        info = self.get_json("/server_info")
        return int(info.get("command_line_options", {}).get("restart_epoch", 0)), int(
            str(info.get("uptime_current_epoch", "0s")).rstrip("s") or 0
        )
