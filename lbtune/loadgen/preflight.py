"""Before any load: is the target there, and does it serve the scenario's models?

:func:`served_models` sends real HTTP requests (``GET /v1/models``), never a bare TCP
connect: a connection opened and closed without a request is counted by HAProxy as a
failed client request (``ereq``), so a reachability probe that way would put one error
into the very counters a run reads. ``GET /v1/models`` is routed, answered and counted
like any other successful request.

A balancer answers ``/v1/models`` from one replica, which may serve only some of the
models; the answer is asked up to ``tries`` times and the model lists are merged.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping

from lbtune.errors import ConfigError, TargetError

__all__ = ["check_models", "served_models"]


def _get(url: str, timeout_s: float, headers: Mapping[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""


def served_models(
    base_url: str,
    *,
    timeout_s: float = 5.0,
    tries: int = 1,
    headers: Mapping[str, str] | None = None,
) -> set[str] | None:
    """The model ids ``base_url/v1/models`` lists (merged over ``tries`` answers), or None
    when the target answers but has no model list (404, not JSON).

    Raises :class:`TargetError` when nothing answers an HTTP request.
    """
    url = base_url.rstrip("/") + "/v1/models"
    found: set[str] | None = None
    for _ in range(max(1, tries)):
        try:
            status, body = _get(url, timeout_s, headers or {})
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            raise TargetError(
                f"target {base_url} is unreachable ({reason}); start the balancer, or omit "
                "--target to use the embedded cluster"
            ) from None
        if status != 200:
            return found
        try:
            doc = json.loads(body)
            ids = {str(m["id"]) for m in doc["data"]}
        except (ValueError, KeyError, TypeError):
            return found
        found = ids | (found or set())
    return found


def check_models(wanted: Iterable[str], served: set[str] | None, where: str) -> None:
    """Refuse (one line, nothing sent) when ``where`` does not serve every wanted model;
    ``served`` None (no model list) checks nothing."""
    if served is None:
        return
    missing = [m for m in dict.fromkeys(wanted) if m not in served]
    if missing:
        raise ConfigError(
            f"{where} does not serve {', '.join(missing)} (it serves: "
            f"{', '.join(sorted(served)) or 'no model'}); fix the scenario's models: "
            "nothing was sent"
        )
