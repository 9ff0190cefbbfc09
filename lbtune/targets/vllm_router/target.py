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
from lbtune.targets.base import ApplyResult, ParamSet, ParamValue
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace
from lbtune.targets.vllm_router import process as router

__all__ = ["SPACE_FILE", "VllmRouterTarget"]

log = logging.getLogger(__name__)

SPACE_FILE = Path(__file__).with_name("space.yaml")


class VllmRouterTarget:
    """``VllmRouterTarget(endpoints)``: the cluster's vllm-router as a tunable target."""

    name = "vllm-router"
    state_dir: Path
    """The cluster's state dir: lbtune.apply keeps the lock, the LKG and its logs there."""

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
        self._space: ParameterSpace | None = None

    def __repr__(self) -> str:
        return f"VllmRouterTarget({self.paths.root})"

    def space(self) -> ParameterSpace:
        if self._space is None:
            self._space = ParameterSpace.load(self.space_file)
        return self._space

    def read_live(self) -> ParamSet:
        """The running router's flags (every knob), verified against its recorded start."""
        _, command = router.live_command(self.paths)
        live: ParamSet = dict(command.params)
        return self.space().complete({}, live)

    def validate(self, params: Mapping[str, object]) -> ParamSet:
        return self.space().validate(params)

    def owned_elsewhere(self) -> frozenset[str]:
        return frozenset()

    def replicas_out(self, params: ParamSet) -> frozenset[str]:
        return frozenset()  # no per-worker knob takes a worker out of rotation

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        t0 = time.perf_counter()
        space = self.space()
        checked = self.validate(params)
        _, current = router.live_command(self.paths)
        live = space.complete({}, dict(current.params))
        desired = space.complete(checked, live)
        diff: dict[str, tuple[ParamValue | None, ParamValue | None]] = {
            k: (live.get(k), v) for k, v in desired.items() if live.get(k) != v
        }
        if check or not diff:
            return ApplyResult(
                changed=bool(diff),
                applied=desired if check else live,
                diff=diff,
                reloaded=bool(diff) and check,
                check=check,
                seconds=time.perf_counter() - t0,
            )
        new = router.RouterCommand(
            params=router.active(dict(desired)),
            worker_urls=current.worker_urls,
            host=current.host,
            port=current.port,
            metrics_port=current.metrics_port,
        )
        try:
            self._restart(new)
            applied = self.verify(desired)
        except LbtuneError as exc:
            self._restore(current, exc)
            raise ApplyError(
                f"vllm-router apply failed ({exc}); restarted with the previous flags"
            ) from None
        return ApplyResult(
            changed=True,
            applied=applied,
            diff=diff,
            reloaded=True,
            seconds=time.perf_counter() - t0,
        )

    def verify(self, desired: ParamSet) -> ParamSet:
        """Read back; raise ApplyError naming every knob that is not what was applied."""
        live = self.read_live()
        wrong = {k: (v, live.get(k)) for k, v in desired.items() if live.get(k) != v}
        if wrong:
            detail = ", ".join(f"{k}: wanted {a!r}, live {b!r}" for k, (a, b) in wrong.items())
            raise ApplyError(f"vllm-router read-back differs: {detail}")
        return live

    def rollback(self, *, check: bool = False) -> ApplyResult:
        """Re-apply the last known good (``lbtune.targets.lkg``); ``check``: only the diff."""
        lkg = LkgStore(self.state_dir, self.name).get()
        if lkg is None:
            raise ApplyError(f"No last known good recorded for vllm-router in {self.state_dir}")
        return self.apply(lkg.params, check=check)

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
