"""The Envoy target: parameters → Envoy's file-based xDS, verified through the admin API.

Both paths call :meth:`EnvoyTarget.apply`: the direct one (optimizer trials) and the
Ansible module ``lbtune/data/playbooks/library/lbtune_envoy.py`` (``lbtune apply --target envoy``).

An apply:

1. validates the parameters against the space and completes them with what is live;
2. renders every xDS file from the full set (:func:`lbtune.targets.envoy.config.render`)
   and compares it with the files on disk: endpoint files only → a live change (EDS);
   a cluster or route file → a structural change (CDS/RDS);
3. structural: ``envoy --mode validate`` on one static config holding everything
   *before* any file is replaced (a rejected config is a :class:`RejectedBeforeApply`
   with Envoy's reason and nothing is touched);
4. replaces the changed files by rename (endpoints, then clusters, then routes). Envoy
   re-reads each at once: weights change in place; a changed cluster is built and warmed
   (endpoints loaded, first health check passed) beside the old one, which keeps serving
   until the new one takes over; requests in flight finish on the old one. No restart;
5. reads back until Envoy reports what was applied: weights from ``/clusters``, the
   cluster and route knobs from ``/config_dump``, no cluster still warming.

Weight 0 renders as ``health_status: DRAINING`` (Envoy's weights are >= 1): no new
requests, streams in flight finish. While the cluster's feedback agent pushes the weights,
they are its own (:class:`~lbtune.targets.targetbase.TargetBase`'s policy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from lbtune.errors import ApplyError
from lbtune.targets.base import ApplyResult, ParamSet, Plan, RejectedBeforeApply, mismatches
from lbtune.targets.envoy import config, deploy, readback
from lbtune.targets.envoy.admin import EnvoyAdmin
from lbtune.targets.envoy.config import Layout
from lbtune.targets.targetbase import WEIGHT_PREFIX, TargetBase

__all__ = ["SPACE_FILE", "EnvoyTarget"]

log = logging.getLogger(__name__)

SPACE_FILE = Path(__file__).with_name("space.yaml")
SETTLE_TIMEOUT_S = 15.0


class EnvoyTarget(TargetBase):
    """``EnvoyTarget(layout, state_dir=...)``: a running Envoy launched by lbtune.

    ``agent_settings``: the cluster's feedback agent settings (``Endpoints.agent_config``)
    when it runs one; while that agent pushes the weights they are its own.
    """

    name = "envoy"
    packaged_space = SPACE_FILE
    max_weight = 256
    """The largest weight of the space (LiveWeights)."""

    def __init__(
        self,
        layout: Layout,
        *,
        state_dir: str | Path,
        space_file: str | Path | None = None,
        agent_settings: str | Path | None = None,
        settle_timeout_s: float = SETTLE_TIMEOUT_S,
    ) -> None:
        self.layout = layout
        self.state_dir = Path(state_dir)
        self.space_file = Path(space_file) if space_file else SPACE_FILE
        self.agent_settings = Path(agent_settings) if agent_settings else None
        self.settle_timeout_s = settle_timeout_s
        self.admin = EnvoyAdmin(layout.admin_url)

    def __repr__(self) -> str:
        return f"EnvoyTarget({self.layout.config_dir})"

    # -- space & read-back -------------------------------------------------------------

    def replica_names(self) -> list[str]:
        return [r.name for r in self.layout.replicas]

    def live_state(self) -> tuple[ParamSet, list[str]]:
        """(every knob as live now, what is not settled: clusters still warming or
        disagreeing with ``all``). Knobs Envoy's config does not show (inactive ones) come
        from lbtune's record, else the baseline."""
        space = self.limits()
        clusters = [c["cluster"] for c in self.admin.config_dump("dynamic_active_clusters")]
        routes = [c["route_config"] for c in self.admin.config_dump("dynamic_route_configs")]
        warming = self.admin.config_dump("dynamic_warming_clusters")
        knobs, odd = readback.effective(clusters, routes)
        weights = readback.weights(self.admin.hosts())
        live: ParamSet = {
            k: v for k, v in (deploy.read_record(self.layout) or {}).items() if k in space.params
        }
        live.update({k: v for k, v in knobs.items() if k in space.params})
        for replica, w in weights.items():
            if WEIGHT_PREFIX + replica in space.params:
                live[WEIGHT_PREFIX + replica] = w
        unsettled = [f"cluster {n} disagrees with `all`" for n in odd]
        unsettled += [f"{len(warming)} cluster(s) still warming"] if warming else []
        return space.complete({}, live), unsettled

    def read_live(self) -> ParamSet:
        return self.live_state()[0]

    # -- apply ---------------------------------------------------------------------------

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        began = time.perf_counter()
        checked = self.validate(params)
        live = self.read_live()
        desired = self.limits().complete(checked, live)
        files = config.render(self.layout, desired)
        on_disk = deploy.current_files(self.layout, list(files))
        differ = [n for n in files if files[n] != on_disk[n]]
        structural = any(n in deploy.STRUCTURAL_FILES for n in differ)
        plan = Plan(live, desired, reload=structural, began=began, drift=bool(differ))
        if check or not plan.changed:
            return plan.untouched(check=check)
        if structural:
            deploy.validate(self.layout, desired)
        deploy.write_record(self.layout, desired, files)
        deploy.write_files(self.layout, files)
        return plan.done(self.settle(desired))

    def settle(self, desired: ParamSet) -> ParamSet:
        """Wait until Envoy reports ``desired``; ApplyError naming what differs if it does
        not within ``settle_timeout_s``."""
        owned = self.owned_elsewhere()
        deadline = time.monotonic() + self.settle_timeout_s
        while True:
            live, unsettled = self.live_state()
            bad = unsettled + mismatches(desired, live, skip=owned)
            if not bad:
                return live
            if time.monotonic() > deadline:
                raise ApplyError(
                    f"Envoy does not report what was applied after {self.settle_timeout_s:g} s: "
                    + "; ".join(bad[:5])
                )
            time.sleep(0.005)

    # -- live weights (the feedback agent's actuator) ------------------------------------

    def weights(self) -> dict[str, int]:
        return readback.weights(self.admin.hosts())

    def set_weights(self, weights: Mapping[str, int]) -> None:
        """Rewrite the endpoint files with these weights (others keep theirs); wait until
        Envoy reports them."""
        replicas = {r.name for r in self.layout.replicas}
        unknown = sorted(set(weights) - replicas)
        if unknown:
            raise RejectedBeforeApply(f"Unknown replica(s) {', '.join(unknown)}")
        params = self.read_live()
        params.update({WEIGHT_PREFIX + r: int(w) for r, w in weights.items()})
        self.limits().validate({WEIGHT_PREFIX + r: int(w) for r, w in weights.items()})
        files = config.render(self.layout, params)
        eds = {n: t for n, t in files.items() if n not in deploy.STRUCTURAL_FILES}
        deploy.write_files(self.layout, eds)
        wanted = dict(weights)
        _wait(lambda: _has(self.weights(), wanted), self.settle_timeout_s)


def _has(live: Mapping[str, int], wanted: Mapping[str, int]) -> bool:
    return all(live.get(k) == v for k, v in wanted.items())


def _wait(ok: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise ApplyError(f"Envoy did not report the new weights within {timeout_s:g} s")
        time.sleep(0.005)
