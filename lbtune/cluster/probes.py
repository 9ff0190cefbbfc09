"""Small, bounded probes of the cluster's parts: HTTP, HAProxy's runtime API, Prometheus.

Standard library only (``urllib``, ``socket``), with short timeouts, and never through
an HTTP proxy from the environment: every address here is loopback or a replica URL.
"""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    """``(status, body)``; status 0 when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read() or b""
    except (OSError, ValueError):
        return 0, b""


def healthy(url: str, timeout: float = 1.0) -> bool:
    """``GET {url}/health`` answered 200."""
    return http_get(url.rstrip("/") + "/health", timeout)[0] == 200


def port_busy(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port`` (bind test, like the servers do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def haproxy_command(sock_path: str, command: str, timeout: float = 2.0) -> str:
    """Send one command (or several, ``;``-separated) to HAProxy's runtime API."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(command.encode() + b"\n")
        chunks: list[bytes] = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


@dataclass(frozen=True, slots=True)
class ServerStat:
    """One server row of HAProxy's ``show stat``."""

    backend: str
    server: str
    status: str
    """``UP``, ``DOWN``, ``MAINT``, ``DRAIN``, ``no check``..."""
    check_status: str
    sessions: int
    queued: int
    weight: int


def haproxy_servers(sock_path: str) -> list[ServerStat]:
    """Every server of every backend, from ``show stat`` (CSV)."""
    text = haproxy_command(sock_path, "show stat")
    text = text.lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    out: list[ServerStat] = []
    for row in rows:
        name = row.get("svname") or ""
        if not name or name in ("FRONTEND", "BACKEND"):
            continue
        out.append(
            ServerStat(
                backend=row.get("pxname") or "",
                server=name,
                status=row.get("status") or "",
                check_status=row.get("check_status") or "",
                sessions=int(row.get("scur") or 0),
                queued=int(row.get("qcur") or 0),
                weight=int(row.get("weight") or 0),
            )
        )
    return out


def prometheus_targets(prometheus_url: str, timeout: float = 1.0) -> list[dict[str, Any]]:
    """Active scrape targets (``/api/v1/targets``); empty when Prometheus does not answer."""
    status, body = http_get(prometheus_url.rstrip("/") + "/api/v1/targets?state=active", timeout)
    if status != 200:
        return []
    try:
        data = json.loads(body)
        targets: list[dict[str, Any]] = data["data"]["activeTargets"]
    except (ValueError, KeyError, TypeError):
        return []
    return targets


_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape_gauges(url: str, names: tuple[str, ...], timeout: float = 1.0) -> dict[str, float]:
    """Sum over label sets of each gauge in ``names`` from ``{url}/metrics`` (missing → absent)."""
    status, body = http_get(url.rstrip("/") + "/metrics", timeout)
    if status != 200:
        return {}
    out: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None or m.group(1) not in names:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out
