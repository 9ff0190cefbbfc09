"""Does every served model keep a replica that takes traffic — before an apply (by the
parameters) and after it (by a real request per model through the balancer)?

The rule lives here once, for every target: the cluster's model -> replicas map comes
from ``endpoints.json`` in the target's state dir; what "cannot take traffic" means for a
balancer's knobs (weight 0, drained, ...) is the target's own
:meth:`~lbtune.targets.targetbase.TargetBase.replicas_out`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from lbtune.errors import ApplyError, ConfigError
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, read_endpoints
from lbtune.targets.base import ParamSet
from lbtune.targets.targetbase import TargetBase

__all__ = ["PROBE_TIMEOUT_S", "cluster_endpoints", "probe_models", "refuse_unservable"]

PROBE_TIMEOUT_S = 60.0
"""Per request: a real model on CPUs answers one token in seconds, the simulator in ms."""

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def cluster_endpoints(target: TargetBase) -> Endpoints | None:
    """The cluster of the target's state dir (``None`` when it has none: a remote host)."""
    return read_endpoints(StatePaths(target.state_dir))


def models_without_replica(
    replicas: dict[str, list[str]], out: frozenset[str]
) -> dict[str, list[str]]:
    """Model -> its replicas, for each model all of whose replicas are in ``out``."""
    by_model: dict[str, list[str]] = {}
    for name, models in replicas.items():
        for m in models:
            by_model.setdefault(m, []).append(name)
    return {m: names for m, names in sorted(by_model.items()) if set(names) <= out}


def refuse_unservable(target: TargetBase, full: ParamSet, ep: Endpoints) -> None:
    """ConfigError when the full parameter set ``full`` leaves a served model with no
    replica able to take traffic; touches nothing."""
    out = target.replicas_out(full)
    if not out:
        return
    dead = models_without_replica({r.name: list(r.models) for r in ep.replicas}, out)
    if dead:
        model, names = next(iter(dead.items()))
        more = f" (and {len(dead) - 1} more models)" if len(dead) > 1 else ""
        raise ConfigError(
            f"Refused: these parameters leave model {model!r} with no replica able to take "
            f"traffic ({', '.join(names)} all out){more}; keep at least one of its replicas "
            "in rotation (e.g. a weight above 0)"
        )


def _post(url: str, body: dict[str, object], timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read()
            return int(resp.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), (exc.read() or b"")[:200].decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def probe_models(ep: Endpoints, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One real request per served model through the balancer (one output token);
    ApplyError naming the first model that got no 200."""
    url = ep.balancer_url.rstrip("/") + "/v1/chat/completions"
    models = sorted({m for r in ep.replicas for m in r.models})
    for model in models:
        body: dict[str, object] = {
            "model": model,
            "messages": [{"role": "user", "content": "lbtune apply verification"}],
            "max_tokens": 1,
        }
        status, text = _post(url, body, timeout)
        if status != 200:
            got = f"HTTP {status}" if status else "no answer"
            detail = " ".join(text.split())
            raise ApplyError(
                f"Verification request for model {model!r} through {ep.balancer_url} got "
                f"{got}{': ' + detail if detail else ''}"
            )
