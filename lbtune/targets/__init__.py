"""BalancerBase targets: one subpackage per balancer, one line each in :data:`TARGETS`.

:data:`TARGETS` maps a name to ``"module:attribute"``, the attribute being an object
implementing :class:`~lbtune.targets.targetbase.BalancerBase`. The module is imported only when
the balancer is asked for, so ``import lbtune.targets`` stays light (the cluster YAML's
``balancer:`` is checked against the names without importing anything).

The core asks here and never names a balancer::

    balancer("haproxy").launch(spec, supervisor)      # lbtune.cluster
    get_target("haproxy", endpoints).apply(params)     # optimize, lbtune apply
    balancer(endpoints.balancer).weights(endpoints)    # the feedback agent

Adding a balancer: a subpackage ``lbtune/targets/<name>/`` and one line below (see
:mod:`lbtune.targets.base` and ``docs/targets.md``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.errors import ConfigError

if TYPE_CHECKING:
    from lbtune.records.endpoints import Endpoints
    from lbtune.targets.targetbase import BalancerBase, TargetBase

__all__ = ["TARGETS", "balancer", "get_target", "names", "unknown"]

TARGETS: dict[str, str] = {
    "haproxy": "lbtune.targets.haproxy.balancer:BALANCER",
    "vllm-router": "lbtune.targets.vllm_router.balancer:BALANCER",
    "nginx": "lbtune.targets.nginx.balancer:BALANCER",
    "envoy": "lbtune.targets.envoy.balancer:BALANCER",
}


def names() -> list[str]:
    """The registered names, in registry order."""
    return list(TARGETS)


def unknown(name: str, what: str = "target") -> ConfigError:
    """The error for a name not in the registry (it lists the names)."""
    return ConfigError(f"Unknown {what} {name!r}. Available: {', '.join(TARGETS)}")


def balancer(name: str) -> BalancerBase:
    """The registry entry ``name`` (its module imported now); ConfigError listing the names."""
    spec = TARGETS.get(name)
    if spec is None:
        raise unknown(name)
    module, _, attr = spec.partition(":")
    found: BalancerBase = getattr(importlib.import_module(module), attr)
    return found


def get_target(
    name: str, endpoints: Endpoints, *, space_file: str | Path | None = None
) -> TargetBase:
    """Target ``name`` of the running cluster ``endpoints`` (``space_file``: the user's
    own space file instead of the packaged one)."""
    return balancer(name).target(endpoints, space_file=Path(space_file) if space_file else None)
