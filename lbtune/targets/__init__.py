"""Balancer targets: one subpackage per balancer (its runtime API, space, playbook, check).

:data:`TARGETS` maps a name to ``"module:Class"``; the class is imported only when the
target is asked for, so ``import lbtune.targets`` stays light. A target class takes the
running cluster's :class:`~lbtune.cluster.state.Endpoints` and implements
:class:`~lbtune.targets.base.Target`. Adding nginx or Envoy is one line here plus a
subpackage and a playbook ``playbooks/<name>-apply.yml``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lbtune.errors import ConfigError

if TYPE_CHECKING:
    from lbtune.cluster.state import Endpoints
    from lbtune.targets.base import Target

__all__ = ["TARGETS", "get_target", "target_class"]

TARGETS: dict[str, str] = {
    "haproxy": "lbtune.targets.haproxy.target:HaproxyTarget",
    "vllm-router": "lbtune.targets.vllm_router.target:VllmRouterTarget",
}


def target_class(name: str) -> Any:
    """The class registered as ``name`` (imported now); ConfigError listing the names."""
    spec = TARGETS.get(name)
    if spec is None:
        raise ConfigError(f"Unknown target {name!r}. Available: {', '.join(TARGETS)}")
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_target(name: str, endpoints: Endpoints, **options: Any) -> Target:
    """An instance of target ``name`` for the running cluster ``endpoints``."""
    target: Target = target_class(name)(endpoints, **options)
    return target
