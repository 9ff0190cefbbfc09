"""Small, bounded probes of the cluster's parts: HTTP, ports, Prometheus.

Standard library (``urllib``, ``socket``) and ``prometheus_client``'s text parser, with
short timeouts, and never through an HTTP proxy from the environment: every address here
is loopback or a replica URL.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

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


def scrape_gauges(url: str, names: tuple[str, ...], timeout: float = 1.0) -> dict[str, float]:
    """Sum over label sets of each gauge in ``names`` from ``{url}/metrics`` (missing → absent)."""
    status, body = http_get(url.rstrip("/") + "/metrics", timeout)
    if status != 200:
        return {}
    return gauge_sums(body.decode(errors="replace"), names)


def gauge_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum over label sets of each gauge in ``names`` in an exposition text; a text that
    stops parsing keeps the families read before the bad line."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name in names:
                out[family.name] = sum(s.value for s in family.samples if s.name == family.name)
    except ValueError:
        pass
    return out
