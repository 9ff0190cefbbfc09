"""The vllm-router target: its parameters are its flags, so an apply is a restart.

Both paths call :meth:`VllmRouterTarget.apply`: the direct one (optimizer trials,
``lbtune apply --direct``) and the playbooks ``playbooks/vllm-router-apply.yml`` and
``vllm-router-rollback.yml`` that :mod:`lbtune.apply` runs (they run ``python -m
lbtune.targets.vllm_router.target`` on each balancer host, see :func:`main`).

An apply:

1. validates the parameters against the space and completes them with what is live;
2. with no difference, reports ``changed=False`` and touches nothing; in check mode,
   reports the diff and touches nothing;
3. restarts the router with the new flags (stop → start → ``/health``: its port cannot
   be shared, so there is a gap, measured and logged as downtime);
4. reads back the running process's flags from ``/proc/<pid>/cmdline`` (they must be
   the command line recorded at start) and its ``/health``; a mismatch or a router that
   does not come up restarts the previous flags and raises :class:`ApplyError`.

``rollback`` re-applies the last known good (:mod:`lbtune.apply.lkg`), which
:func:`lbtune.apply.apply_params` records under :attr:`VllmRouterTarget.state_dir` after
a verified apply.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from lbtune.cluster import router
from lbtune.cluster.state import Endpoints, StatePaths
from lbtune.errors import ApplyError, ConfigError, LbtuneError, TargetError
from lbtune.targets.base import ApplyResult, ParamSet, ParamValue
from lbtune.targets.space import ParameterSpace

__all__ = ["SPACE_FILE", "VllmRouterTarget", "connect", "main", "result_dict"]

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
        """Re-apply the last known good (``lbtune.apply.lkg``); ``check``: only the diff."""
        from lbtune.apply.lkg import LkgStore

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


def connect(state_dir: str | Path | None = None) -> VllmRouterTarget:
    """The vllm-router target of the cluster running in ``state_dir``."""
    from lbtune.cluster.api import find_state_dir
    from lbtune.cluster.state import read_endpoints

    paths = StatePaths(find_state_dir(state_dir))
    ep = read_endpoints(paths)
    if ep is None:
        raise TargetError(
            f"No running cluster in {paths.root} (endpoints.json missing); start one with "
            "`lbtune cluster up clusters/hetero4-router.yaml`"
        )
    return VllmRouterTarget(ep)


def result_dict(result: ApplyResult, downtime: float | None) -> dict[str, object]:
    """The result in the shape lbtune's playbook runner reads from a host (its ``lbtune``
    dict: ``applied``, ``diff`` as knob -> [before, after], ``reloaded``, ``check``,
    ``seconds``), plus ``changed`` and the restart's ``downtime_s``."""
    return {
        "changed": result.changed,
        "check": result.check,
        "applied": result.applied,
        "diff": {k: list(v) for k, v in result.diff.items()},
        "reloaded": result.reloaded,
        "restarted": result.reloaded and not result.check,
        "downtime_s": downtime,
        "seconds": round(result.seconds, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lbtune.targets.vllm_router.target (--params-json J | --rollback) [--check]``.

    What the playbooks run on a balancer host. Prints one JSON object
    (:func:`result_dict`) on stdout; on failure one line ``error: <ErrorType>: <message>``
    on stderr (the playbook fails with it) and the error's exit code.
    """
    parser = argparse.ArgumentParser(prog="lbtune.targets.vllm_router.target")
    parser.add_argument("--state-dir", default=None)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--params-json", help="the parameters, as a JSON object")
    what.add_argument("--rollback", action="store_true", help="re-apply the host's LKG")
    parser.add_argument("--check", action="store_true", help="report the diff, touch nothing")
    args = parser.parse_args(argv)
    try:
        target = connect(args.state_dir)
        if args.rollback:
            result = target.rollback(check=args.check)
        else:
            try:
                params = json.loads(args.params_json)
            except ValueError as exc:
                raise ConfigError(f"--params-json is not valid JSON: {exc}") from None
            if not isinstance(params, dict):
                raise ConfigError("--params-json must be a JSON object of knob: value")
            result = target.apply(params, check=args.check)
    except LbtuneError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result_dict(result, target.last_downtime_s), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
