"""The vllm-router target: its parameters are its flags, so an apply is a restart.

Both paths call :meth:`VllmRouterTarget.apply`: the direct one (optimizer trials,
``lbtune apply --direct``) and the Ansible module
``lbtune/data/playbooks/library/lbtune_vllm_router.py`` that
``lbtune/data/playbooks/target-apply.yml`` runs on each balancer host.

An apply:

1. validates the parameters against the space and completes them with what is live;
2. with no difference, reports ``changed=False`` and touches nothing; in check mode,
   reports the diff and touches nothing;
3. restarts the router with the new flags (stop → start → ``/health``: its port cannot
   be shared, so there is a gap, measured and logged as downtime);
4. reads back the running process's flags from ``/proc/<pid>/cmdline`` (they must be
   the command line recorded at start) and its ``/health``; a mismatch or a router that
   does not come up restarts the previous flags and raises :class:`ApplyError`.

``rollback`` re-applies the last known good (:mod:`lbtune.targets.lkg`), which
:func:`lbtune.apply.apply_params` records under :attr:`VllmRouterTarget.state_dir` after
a verified apply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from lbtune.errors import ApplyError, LbtuneError
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from lbtune.targets.base import ApplyResult, ParamSet, Plan
from lbtune.targets.targetbase import TargetBase
from lbtune.targets.vllm_router import process as router

__all__ = ["SPACE_FILE", "VllmRouterTarget"]

log = logging.getLogger(__name__)

SPACE_FILE = Path(__file__).with_name("space.yaml")


class VllmRouterTarget(TargetBase):
    """``VllmRouterTarget(endpoints)``: the cluster's vllm-router as a tunable target."""

    name = "vllm-router"
    packaged_space = SPACE_FILE

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        space_file: str | Path | None = None,
        timeout: float = router.ROUTER_TIMEOUT,
    ) -> None:
        self.endpoints = endpoints
        self.paths = StatePaths(Path(endpoints.state_dir))
        self.state_dir = self.paths.root
        self.space_file = Path(space_file) if space_file else SPACE_FILE
        self.timeout = timeout
        self.last_downtime_s: float | None = None
        """Seconds without a router during the last restart."""

    def __repr__(self) -> str:
        return f"VllmRouterTarget({self.paths.root})"

    def replica_names(self) -> None:
        return None  # its flags apply to every worker alike: no per-replica knob

    def read_live(self) -> ParamSet:
        """The running router's flags (every knob), verified against its recorded start."""
        _, command = router.live_command(self.paths)
        live: ParamSet = dict(command.params)
        return self.limits().complete({}, live)

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        began = time.perf_counter()
        space = self.limits()
        checked = self.validate(params)
        _, current = router.live_command(self.paths)
        live = space.complete({}, dict(current.params))
        plan = Plan(live, space.complete(checked, live), reload=True, began=began)
        if check or not plan.changed:
            return plan.untouched(check=check)
        new = router.RouterCommand(
            params=router.active(dict(plan.desired)),
            worker_urls=current.worker_urls,
            host=current.host,
            port=current.port,
            metrics_port=current.metrics_port,
        )
        try:
            self._restart(new)
            applied = self.read_back(plan.desired)
        except LbtuneError as exc:
            self._restore(current, exc)
            raise ApplyError(
                f"vllm-router apply failed ({exc}); restarted with the previous flags"
            ) from None
        return plan.done(applied)

    def _restart(self, command: router.RouterCommand) -> None:
        _, downtime = router.restart(self.paths, command, timeout=self.timeout)
        self.last_downtime_s = downtime
        log.info(
            "vllm-router restarted (policy %s): %.2f s down", command.params["policy"], downtime
        )

    def _restore(self, previous: router.RouterCommand, cause: Exception) -> None:
        log.warning("vllm-router apply failed (%s): restarting the previous flags", cause)
        try:
            self._restart(previous)
        except LbtuneError as exc:
            raise ApplyError(
                f"vllm-router apply failed ({cause}) and the previous flags did not come "
                f"back up either ({exc}); see {self.paths.log(router.COMPONENT)}"
            ) from None
