"""A dead balancer comes back on its last known good, by itself or at ``lbtune cluster up``.

The embedded cluster's processes outlive the CLI (each in its own session). When the
balancer's processes have died (a killed HAProxy worker takes its master with it) while
the replicas and Prometheus still run, it is relaunched exactly as it was launched
(``launch.json``: the same ports and replicas), waited for until it serves, put back on
its last known good (:mod:`lbtune.cluster.restore`), and that is said. Two callers do it:
the cluster's keeper (:mod:`lbtune.cluster.keeper`), which watches the processes between
commands and says so in ``logs/keeper.log``, and ``up`` on a running cluster, which does
not ask for ``down`` first (and says so on the terminal). Both go through
:func:`heal_if_dead`: one heal at a time per state dir (``.heal.lock``), and deadness is
looked at again once the lock is held, so that the second caller finds the balancer the
first one relaunched. The last known good is put back under the cluster's apply lock
(``apply.lock``, waited for up to :data:`APPLY_WAIT_S`), so that it never interleaves
with an apply's own steps; when an apply still holds it, that apply sets the balancer
and the relaunch leaves it alone, saying so. A study that stopped on the dead balancer
then resumes (``lbtune optimize --resume``) on a tuned balancer.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import TypeAdapter, ValidationError

from lbtune import targets
from lbtune.cluster import health, restore
from lbtune.errors import ClusterError
from lbtune.process import affinity, supervisor
from lbtune.process.locks import pid_lock
from lbtune.process.supervisor import ClusterSupervisor, ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import KEEPER, StatePaths, read_endpoints, write_json_atomic
from lbtune.targets.base import LaunchSpec

__all__ = ["APPLY_WAIT_S", "dead_balancer", "heal_balancer", "heal_if_dead", "save_launch"]

_LAUNCH: TypeAdapter[LaunchSpec] = TypeAdapter(LaunchSpec)
APPLY_WAIT_S = 30.0
"""How long a relaunch waits for an apply in progress before it leaves the balancer to it
(an Ansible apply takes seconds, a direct one milliseconds)."""


class _Busy(Exception):
    """The lock is held by another process (its PID)."""


def save_launch(paths: StatePaths, spec: LaunchSpec) -> None:
    """Record what the balancer is launched with, for :func:`heal_balancer`."""
    write_json_atomic(paths.launch, _LAUNCH.dump_json(spec, indent=2).decode() + "\n")


def dead_balancer(ep: Endpoints, records: list[ProcessRecord]) -> list[ProcessRecord]:
    """The balancer's processes that died, when they are all that died (else empty: a
    cluster missing more than its balancer is brought back by ``down`` and ``up``). The
    keeper's own record does not count: a cluster whose keeper gave up is still healed by
    ``up``."""
    dead = [r for r in records if r.name != KEEPER and not supervisor.alive(r)]
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
    what it started is stopped again and the PID files of ``dead`` are put back, so that
    the cluster still says what died and a later heal can try again).
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
    # Watched while the balancer starts: the cluster, not the keeper (which may exit now).
    alive = [r for r in supervisor.records(paths) if r.name != KEEPER and supervisor.alive(r)]
    # Off the servers' CPUs, as `up` launched it (from the keeper too: it runs on the rest).
    cpus = affinity.complement(ep.reserved_cpus)
    try:
        targets.balancer(ep.balancer).launch(spec, ClusterSupervisor(paths, mine, alive, cpus))
    except BaseException:
        for rec in reversed(mine):
            supervisor.stop(rec, paths)
        for rec in dead:
            write_json_atomic(paths.pid_file(rec.name), rec.to_json())
        raise
    try:
        with pid_lock(paths.apply_lock, _Busy, wait_s=APPLY_WAIT_S):
            restore.restore_last_known_good(ep, say)
    except _Busy as busy:
        say(
            f"an apply (pid {busy}) holds {paths.apply_lock}: "
            f"it sets {ep.balancer}, not this relaunch"
        )
    supervisor.wait_until(
        lambda: health.prometheus_missing(ep), scrape_timeout_s, "Prometheus scrapes", mine
    )
    say(f"{ep.balancer} relaunched (pids {', '.join(str(r.pid) for r in mine)})")


def heal_if_dead(
    paths: StatePaths, say: Callable[[str], None], scrape_timeout_s: float, wait_s: float
) -> bool:
    """Relaunch the balancer of the cluster in ``paths`` when it (and only it) is dead, as
    :func:`heal_balancer` does; True when it did.

    Under the heal lock (``.heal.lock``, waiting up to ``wait_s``; False when another heal
    still holds it then) the endpoints and the PID files are read again, so that a
    balancer another heal relaunched meanwhile is found alive and left alone. The kernel
    drops the lock with its holder, so a keeper killed mid-heal leaves none behind.
    """
    try:
        with pid_lock(paths.heal_lock, _Busy, wait_s=wait_s):
            return _heal_if_dead(paths, say, scrape_timeout_s)
    except _Busy:
        return False


def _heal_if_dead(paths: StatePaths, say: Callable[[str], None], scrape_timeout_s: float) -> bool:
    ep = read_endpoints(paths)
    dead = [] if ep is None else dead_balancer(ep, supervisor.records(paths))
    if ep is None or not dead:
        return False
    heal_balancer(ep, paths, dead, say, scrape_timeout_s)
    return True


def _how(rec: ProcessRecord) -> str:
    code = supervisor.exited(rec)
    return f"{rec.name} pid {rec.pid} gone" + ("" if code is None else f", exit status {code}")
