"""What an lbtune Ansible module runs on a balancer host: the same target hooks as the
direct path, for any registered target.

Every target's module (``lbtune/data/playbooks/library/lbtune_<name>.py``) is a few lines that call
:func:`run_module`; ``lbtune/data/playbooks/target-apply.yml`` runs whichever module the target's
:attr:`~lbtune.targets.targetbase.BalancerBase.ansible_module` names. One shape for every balancer:

* ``apply(params)``, verified by read-back on the host;
* check mode (``--check``) calls ``apply(params, check=True)``: nothing is touched and the
  diff comes back (``--diff`` shows it as before/after YAML);
* ``rollback: true`` calls ``TargetBase.rollback()``. ``params`` then carries the controller's
  last known good, which first becomes the host's own (a remote host has no other record
  of it; on the controller's own host it is the same file and nothing changes).

The controller (:mod:`lbtune.apply`) records the last known good only after the whole
play succeeded and its own read-back agreed, so a failure later in the play never makes
the failed parameters "known good".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lbtune.apply.serving import refuse_unservable
from lbtune.errors import ConfigError, LbtuneError, TargetError
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, read_endpoints
from lbtune.targets import get_target
from lbtune.targets.base import ApplyResult
from lbtune.targets.lkg import LkgStore, params_hash
from lbtune.targets.targetbase import TargetBase

__all__ = ["ARGUMENT_SPEC", "HostRequest", "Module", "module_result", "run_module", "run_on_host"]

MakeTarget = Callable[[Endpoints, Mapping[str, Any]], TargetBase]
"""Builds a target from the host's endpoints and the module's ``options``."""


@dataclass(frozen=True)
class HostRequest:
    """One module invocation."""

    target: str
    state_dir: Path
    params: Mapping[str, object] = field(default_factory=dict)
    check: bool = False
    rollback: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    """Target-specific test hooks (e.g. HAProxy's ``template_overrides``)."""


def _endpoints(state_dir: Path) -> Endpoints:
    ep = read_endpoints(StatePaths(state_dir))
    if ep is None:
        raise TargetError(f"No lbtune-managed balancer in {state_dir} (no endpoints.json)")
    return ep


def run_on_host(req: HostRequest, make_target: MakeTarget | None = None) -> ApplyResult:
    """Apply (or check, or roll back) on this host; LbtuneError on failure."""
    ep = _endpoints(req.state_dir)
    if ep.balancer != req.target:
        raise ConfigError(
            f"{req.state_dir} runs {ep.balancer}, not {req.target}: pick the inventory's "
            f"balancers of one kind per run"
        )
    target = make_target(ep, req.options) if make_target else get_target(req.target, ep)
    if not req.rollback:
        full = target.limits().complete(target.validate(req.params), target.read_live())
        refuse_unservable(target, full, ep)  # this host's own model -> replicas map
        return target.apply(req.params, check=req.check)
    if req.params and not req.check:
        store = LkgStore(target.state_dir, target.name)
        last = store.get()
        good = target.validate(req.params)
        if last is None or last.sha256 != params_hash(good):
            store.record(good, "the controller's last known good")
    return target.rollback(check=req.check)


def module_result(result: ApplyResult) -> dict[str, Any]:
    """The ``lbtune`` dict every module returns (what ``lbtune.apply.runner`` reads)."""
    return {
        "applied": result.applied,
        "diff": {k: [b, a] for k, (b, a) in result.diff.items()},
        "reloaded": result.reloaded,
        "check": result.check,
        "seconds": result.seconds,
    }


def _yaml(d: Mapping[str, Any]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in sorted(d.items()))


ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "state_dir": {"type": "path", "required": True},
    "params": {"type": "dict", "default": {}},
    "rollback": {"type": "bool", "default": False},
    "options": {"type": "dict", "default": {}},
}
"""The arguments of every lbtune module (``lbtune/data/playbooks/target-apply.yml`` passes them)."""


class Module(Protocol):
    """What :func:`run_module` uses of ``ansible.module_utils.basic.AnsibleModule``."""

    params: dict[str, Any]
    check_mode: bool

    def exit_json(self, **kwargs: Any) -> None: ...

    def fail_json(self, msg: str, **kwargs: Any) -> None: ...


def run_module(module: Module, target: str, make_target: MakeTarget | None = None) -> None:
    """The body of ``lbtune/data/playbooks/library/lbtune_<name>.py``, given its ``AnsibleModule``
    built with :data:`ARGUMENT_SPEC` (Ansible packages a module as a new-style module
    only when the module file itself imports ``ansible.module_utils``)."""
    p = module.params
    req = HostRequest(
        target=target,
        state_dir=Path(p["state_dir"]),
        params=dict(p["params"] or {}),
        check=module.check_mode,
        rollback=bool(p["rollback"]),
        options=dict(p["options"] or {}),
    )
    try:
        result = run_on_host(req, make_target)
    except LbtuneError as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__)
        return
    out = module_result(result)
    module.exit_json(
        changed=result.changed,
        diff={
            "before": _yaml({k: v[0] for k, v in out["diff"].items()}),
            "after": _yaml({k: v[1] for k, v in out["diff"].items()}),
            "before_header": "live",
            "after_header": "rolled back" if req.rollback else "requested",
        },
        lbtune=out,
    )
