"""Apply a parameter set safely: validate, lock, apply (Ansible or direct), verify, record
the last known good — and roll back to it when anything fails after the balancer was touched.

The optimizer's per-trial path is ``target.apply(params)`` (direct, ~ms, no LKG record) or
``apply_params(target, params, via="direct", record=False)`` (adds the lock and the
automatic rollback); ``lbtune apply`` uses ``via="ansible"``:
``lbtune/data/playbooks/target-apply.yml``
with the target's own module
(:attr:`~lbtune.targets.targetbase.BalancerBase.ansible_module`), the same for every
balancer. A rollback (``lbtune rollback``, or after a failed apply) is
:meth:`~lbtune.targets.targetbase.TargetBase.rollback` — directly, or through the same
playbook with ``lbtune_rollback``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lbtune.apply.claim import refuse_if_leased
from lbtune.apply.lock import apply_lock
from lbtune.apply.runner import LOCAL_INVENTORY, HostResult, check_inventory, run_playbook
from lbtune.apply.serving import cluster_endpoints, probe_models, refuse_unservable
from lbtune.errors import ApplyError, ConfigError, LbtuneError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import balancer
from lbtune.targets.base import ApplyResult, ParamSet, RejectedBeforeApply
from lbtune.targets.lkg import Lkg, LkgStore, params_hash
from lbtune.targets.targetbase import TargetBase

__all__ = ["ApplyOutcome", "HostResult", "apply_params", "rollback"]

log = logging.getLogger(__name__)
Via = Literal["ansible", "direct"]
PLAYBOOK = "target-apply.yml"


@dataclass(frozen=True)
class ApplyOutcome:
    result: ApplyResult
    hosts: list[HostResult] = field(default_factory=list)
    via: Via = "direct"
    lkg: Lkg | None = None
    """The last known good after this apply."""
    log_path: Path | None = None


def _is_local(inventory: str | Path | None) -> bool:
    return inventory is None or Path(inventory).resolve() == LOCAL_INVENTORY.resolve()


def _run(
    target: TargetBase,
    params: ParamSet,
    *,
    via: Via,
    check: bool,
    inventory: str | Path | None,
    rollback: bool = False,
    extravars: Mapping[str, Any] | None = None,
) -> tuple[ApplyResult, list[HostResult], Path | None]:
    if via == "direct":
        result = target.rollback(check=check) if rollback else target.apply(params, check=check)
        return result, [HostResult("local", "changed" if result.changed else "ok")], None
    run = run_playbook(
        PLAYBOOK,
        state_dir=target.state_dir,
        inventory=inventory,
        check=check,
        diff=check,
        extravars={
            "lbtune_target": target.name,
            "lbtune_module": balancer(target.name).ansible_module,
            # the host's own lbtune_state_dir (a remote inventory's host var) wins
            "lbtune_controller_state_dir": str(target.state_dir),
            "lbtune_params": dict(params),
            "lbtune_rollback": rollback,
            **dict(extravars or {}),
        },
    )
    if not run.ok:
        touched = [h.host for h in run.hosts if _touched(h)]
        what = "rollback" if rollback else "apply"
        msg = f"ansible-playbook {PLAYBOOK} ({target.name} {what}) failed: {run.failure()}"
        if not touched and any("RejectedBeforeApply" in h.msg for h in run.hosts):
            raise RejectedBeforeApply(msg)
        raise PlaybookFailed(msg, touched)
    first = next((h.result for h in run.hosts if h.result), {})
    diff = {k: (v[0], v[1]) for k, v in (first.get("diff") or {}).items()}
    result = ApplyResult(
        changed=any(h.status == "changed" for h in run.hosts),
        applied=dict(first.get("applied") or params),
        diff=diff,
        reloaded=bool(first.get("reloaded")),
        check=check,
        seconds=run.seconds,
    )
    return result, run.hosts, run.log_path


class PlaybookFailed(ApplyError):
    """The playbook failed on some host; ``touched``: the hosts it may have changed (a
    later batch never ran, a refused or unreachable-at-connect host was not touched)."""

    def __init__(self, msg: str, touched: list[str]) -> None:
        super().__init__(msg)
        self.touched = touched


_UNTOUCHED = ("RejectedBeforeApply:", "ConfigError:")


def _touched(h: HostResult) -> bool:
    if h.status == "changed":
        return True
    if h.status == "unreachable":  # not even connected: untouched; lost mid-module: maybe
        return not any(m in h.msg for m in ("Failed to connect to the host", "ssh: connect to"))
    return h.status == "failed" and not h.msg.startswith(_UNTOUCHED)


def _verify(target: TargetBase, expected: ParamSet | None, ep: Endpoints | None) -> None:
    """After an apply: read back what ``expected`` holds (where lbtune can read it) and
    send one real request per served model (on a local cluster); ApplyError otherwise."""
    if expected is not None:
        bad = target.mismatches(expected, target.read_live())
        if bad:
            shown = "; ".join(bad[:4])
            raise ApplyError(f"Read-back after the apply does not match: {shown}")
    if ep is not None:
        probe_models(ep)


def apply_params(
    target: TargetBase,
    params: Mapping[str, object],
    *,
    via: Via = "ansible",
    check: bool = False,
    inventory: str | Path | None = None,
    source: str = "api",
    record: bool = True,
    extravars: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ApplyOutcome:
    """Apply ``params`` as one transaction: validate, lock, apply, verify, record the LKG.

    Refused before anything is touched: knobs or values outside the target's space
    (ConfigError naming ``source``) or outside what the balancer itself accepts
    (:meth:`~lbtune.targets.targetbase.TargetBase.limits`, whatever the space allows); a
    set that leaves a served model with no replica able to take traffic; a cluster whose
    lease a study of another process holds (:class:`~lbtune.apply.claim.ClusterBusy`).
    Verified after the apply by read-back and by one real request per served model through
    the balancer. On any failure once the balancer may have been touched, the state that
    was live before is put back (on a remote inventory, whose live state lbtune cannot
    read: the last known good, on the hosts the rollout touched) and ApplyError says so.
    The first apply on a fresh cluster first records what is live as the last known good
    (``baseline``).
    """
    checked = target.space().validate(params, source=source)  # errors name the source
    target.validate(checked)  # the balancer's own limits and refusals, before the lock
    if via == "ansible" and inventory is not None:
        check_inventory(inventory)
    if not check:
        refuse_if_leased(target.state_dir, target.name, "apply")
    say = progress or log.info
    with apply_lock(target.state_dir):
        store = LkgStore(target.state_dir, target.name)
        lkg = store.get()
        local = _is_local(inventory)
        live = target.read_live() if local else None
        expected = target.limits().complete(checked, live) if live is not None else None
        ep = cluster_endpoints(target) if local else None
        if expected is not None and ep is not None:
            refuse_unservable(target, expected, ep)  # before anything, the LKG included
        if lkg is None and not check and live is not None:
            lkg = store.record(live, "baseline (live before the first apply)")
        try:
            result, hosts, log_path = _run(
                target, checked, via=via, check=check, inventory=inventory, extravars=extravars
            )
            if not check:
                _verify(target, expected, ep)
        except (RejectedBeforeApply, ConfigError):
            raise  # refused before the balancer was touched
        except (Exception, KeyboardInterrupt) as exc:
            if check:
                raise
            undo = _Undo(target, via, inventory, live, lkg, say)
            message = undo.run(exc)
            if not isinstance(exc, LbtuneError):
                raise  # a bug keeps its traceback (the previous state is back)
            raise ApplyError(message) from None
        if record and not check and (lkg is None or lkg.sha256 != params_hash(result.applied)):
            lkg = store.record(result.applied, source)
        return ApplyOutcome(result=result, hosts=hosts, via=via, lkg=lkg, log_path=log_path)


@dataclass(frozen=True)
class _Undo:
    """Puts back what was live before a failed apply: the state read before it (on this
    machine), else the last known good on the hosts the rollout touched."""

    target: TargetBase
    via: Via
    inventory: str | Path | None
    live: ParamSet | None
    lkg: Lkg | None
    say: Callable[[str], None]

    def run(self, exc: BaseException) -> str:
        """Undo after ``exc``; the one-line message that says what happened."""
        if self.live is not None:
            return self._restore_live(exc)
        if self.lkg is None:
            return f"{exc}; no last known good recorded: nothing to roll back to"
        return self._rollback_hosts(exc, self.lkg)

    def _restore_live(self, exc: BaseException) -> str:
        assert self.live is not None
        if isinstance(exc, PlaybookFailed) and exc.touched == []:
            return f"{exc}; no host was changed: nothing to put back"
        self.say(f"apply failed ({exc}); putting back the state live before it")
        try:
            self.target.apply(self.live)  # checked against the balancer's limits only
            bad = self.target.mismatches(self.live, self.target.read_live())
            if bad:
                raise ApplyError("read-back after the restore: " + "; ".join(bad[:3]))
        except (LbtuneError, OSError) as exc2:
            if self.lkg is None:
                return f"{exc}; putting back the previous state failed too: {exc2}"
            self.say(f"putting back the previous state failed ({exc2}); rolling back")
            try:
                self.target.rollback()
            except (LbtuneError, OSError) as exc3:
                return (
                    f"{exc}; putting back the previous state failed ({exc2}) and so did the "
                    f"rollback to the last known good: {exc3}"
                )
            return (
                f"{exc}; putting back the previous state failed ({exc2}): rolled back to "
                f"the last known good {self.lkg.describe()}"
            )
        if self.lkg is not None and self.lkg.sha256 == params_hash(self.live):
            return f"{exc}; rolled back to the last known good {self.lkg.describe()}"
        return f"{exc}; put back the state that was live before the apply"

    def _rollback_hosts(self, exc: BaseException, lkg: Lkg) -> str:
        # Only the hosts this rollout touched: the others are still on the last known
        # good (or unreachable), and a host that refused the set may refuse again.
        touched = exc.touched if isinstance(exc, PlaybookFailed) else None
        if touched == []:
            return f"{exc}; no host was changed: nothing to roll back"
        only = {"lbtune_hosts": ",".join(touched)} if touched else None
        which = f" (hosts {', '.join(touched)})" if touched else ""
        back = f"rolling back to the last known good {lkg.describe()}{which}"
        self.say(f"apply failed ({exc}); {back}")
        try:
            _run(
                self.target,
                lkg.params,
                via=self.via,
                check=False,
                inventory=self.inventory,
                rollback=True,
                extravars=only,
            )
        except ApplyError as exc2:
            return f"{exc}; the rollback failed too: {exc2}"
        return f"{exc}; rolled back to the last known good {lkg.describe()}{which}"


def rollback(
    target: TargetBase,
    *,
    via: Via = "ansible",
    inventory: str | Path | None = None,
    check: bool = False,
) -> ApplyOutcome:
    """:meth:`TargetBase.rollback` on every host (ApplyError when no last known good was
    recorded); ``check``: only the diff."""
    if not check:
        refuse_if_leased(target.state_dir, target.name, "rollback")
    with apply_lock(target.state_dir):
        lkg = LkgStore(target.state_dir, target.name).get()
        if lkg is None:
            raise ApplyError(
                f"No last known good for {target.name} in {target.state_dir}: nothing was "
                "applied through lbtune yet"
            )
        result, hosts, log_path = _run(
            target, lkg.params, via=via, check=check, inventory=inventory, rollback=True
        )
        return ApplyOutcome(result=result, hosts=hosts, via=via, lkg=lkg, log_path=log_path)
