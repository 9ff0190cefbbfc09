"""A dead balancer comes back on its last known good: ``lbtune cluster up`` heals it.

The embedded cluster's processes outlive the CLI (each in its own session), so nothing
watches them between commands. When the balancer's processes have died (a killed HAProxy
worker takes its master with it) while the replicas and Prometheus still run, ``up``
does not ask for ``down`` first: it relaunches the balancer exactly as it was launched
(``launch.json``: the same ports and replicas), waits until it serves, puts its last
known good back (:mod:`lbtune.cluster.restore`) and says so. A study that stopped on the
dead balancer then resumes (``lbtune optimize --resume``) on a tuned balancer.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import TypeAdapter, ValidationError

from lbtune import targets
from lbtune.cluster import health, restore
from lbtune.errors import ClusterError
from lbtune.process import supervisor
from lbtune.process.supervisor import ClusterSupervisor, ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, write_json_atomic
from lbtune.targets.base import LaunchSpec

__all__ = ["dead_balancer", "heal_balancer", "save_launch"]

_LAUNCH: TypeAdapter[LaunchSpec] = TypeAdapter(LaunchSpec)


def save_launch(paths: StatePaths, spec: LaunchSpec) -> None:
    """Record what the balancer is launched with, for :func:`heal_balancer`."""
    write_json_atomic(paths.launch, _LAUNCH.dump_json(spec, indent=2).decode() + "\n")


def dead_balancer(ep: Endpoints, records: list[ProcessRecord]) -> list[ProcessRecord]:
    """The balancer's processes that died, when they are all that died (else empty: a
    cluster missing more than its balancer is brought back by ``down`` and ``up``)."""
    dead = [r for r in records if not supervisor.alive(r)]
    if dead and all(r.name in ep.balancer_components for r in dead):
        return dead
    return []


def heal_balancer(
    ep: Endpoints,
    paths: StatePaths,
    dead: list[ProcessRecord],
    say: Callable[[str], None],
    scrape_timeout_s: float,
) -> None:
    """Relaunch ``ep``'s balancer as it was launched, put its last known good back and wait
    (``scrape_timeout_s``) until Prometheus scrapes it again.

    Raises :class:`ClusterError` when it cannot (no ``launch.json``, or the relaunch fails:
    what it started is stopped again).
    """
    try:
        spec = _LAUNCH.validate_json(paths.launch.read_bytes())
    except (OSError, ValidationError):
        raise ClusterError(
            f"{ep.balancer} in {paths.root} is not running and {paths.launch} cannot be "
            f"read to relaunch it; run `lbtune cluster down --state-dir {paths.root}` and up again"
        ) from None
    why = "; ".join(_how(r) for r in dead)
    say(f"{ep.balancer} is not running ({why}): relaunching it")
    for name in ep.balancer_components:  # what is left of it (a master without workers)
        old = supervisor.read_record(paths, name)
        if old is not None:
            supervisor.stop(old, paths)
    mine: list[ProcessRecord] = []
    alive = [r for r in supervisor.records(paths) if supervisor.alive(r)]
    try:
        targets.balancer(ep.balancer).launch(spec, ClusterSupervisor(paths, mine, watch=alive))
    except BaseException:
        for rec in reversed(mine):
            supervisor.stop(rec, paths)
        raise
    restore.restore_last_known_good(ep, say)
    supervisor.wait_until(
        lambda: health.prometheus_missing(ep), scrape_timeout_s, "Prometheus scrapes", mine
    )
    say(f"{ep.balancer} relaunched (pids {', '.join(str(r.pid) for r in mine)})")


def _how(rec: ProcessRecord) -> str:
    code = supervisor.exited(rec)
    return f"{rec.name} pid {rec.pid} gone" + ("" if code is None else f", exit status {code}")
