"""The keeper: the embedded cluster relaunches its dead balancer without being asked.

The cluster's processes outlive the CLI (each in its own session, known by its PID file:
:mod:`lbtune.process.supervisor`), so between two commands nothing of lbtune would notice
the balancer dying: a killed HAProxy worker takes its master with it and the cluster
stays without a balancer until someone runs ``lbtune cluster up``. So ``up`` starts one
more component, last: ``python -m lbtune.cluster.keeper --state-dir DIR``
(``keeper.pid``, ``logs/keeper.log``). Once a second it reads the PID files; when the
balancer, and only the balancer (:func:`lbtune.cluster.heal.dead_balancer`), is seen
dead in two looks in a row (the same dead processes: not the instant of a restart that
an apply makes, vllm-router's stop then start), it heals it through
:func:`lbtune.cluster.heal.heal_if_dead`, the path and the lock ``up`` heals with:
relaunched as it was launched, back on its last known good, said in its log.

It does not relaunch forever (:class:`Backoff`): after a failed relaunch it waits longer
before the next, and it gives up, saying why, after 3 failures in a row or 5 relaunches
within 10 minutes (a balancer that keeps dying has a fault that a person must see);
``up`` starts it again. It exits by itself once its cluster is gone (:func:`gone`:
``down`` ran, or nothing of the cluster runs), and at once on SIGTERM: a relaunch in
progress stops what it started. ``down`` stops it before anything else, so that it
never relaunches a balancer that ``down`` is stopping.

Only the balancer is its business: a cluster missing its sim or Prometheus is brought
back by ``down`` and ``up``, and a dead keeper does not make a cluster unhealthy
(:func:`lbtune.cluster.health.problems` says why).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from lbtune.cluster import heal
from lbtune.errors import LbtuneError
from lbtune.process import supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.statedir import KEEPER, StatePaths, read_endpoints

__all__ = ["Backoff", "Keeper", "command", "ensure_running", "gone", "keep", "main", "start"]

log = logging.getLogger(__name__)

POLL_S = 1.0
"""Seconds between two looks: a balancer is relaunched one to two seconds after it died."""
SCRAPE_TIMEOUT_S = 30.0
"""How long a relaunch waits for Prometheus to scrape the balancer again: longer than
``up``'s own wait, since nobody waits on the keeper and a loaded machine is slower."""
START_TIMEOUT_S = 10.0
"""How long a starting keeper waits for ``up`` to write its PID file."""


@dataclass
class Backoff:
    """When the keeper may relaunch again, and when it stops trying.

    After a failed relaunch it waits ``pause_s``, doubled with each failure in a row. It
    gives up after ``max_failures`` failures in a row (the relaunch itself is broken: a
    config the balancer refuses, a port taken) or after ``max_relaunches`` relaunches,
    failed or not, within ``window_s`` (the balancer keeps dying: relaunching it again
    would hide the fault).
    """

    pause_s: float = 2.0
    max_failures: int = 3
    max_relaunches: int = 5
    window_s: float = 600.0
    failures: int = 0
    times: list[float] = field(default_factory=list)
    not_before: float = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.not_before

    def record(self, now: float, ok: bool) -> str | None:
        """Count one relaunch at ``now``; the reason to give up, else ``None``."""
        self.times = [t for t in self.times if now - t < self.window_s] + [now]
        self.failures = 0 if ok else self.failures + 1
        self.not_before = now + (self.pause_s * 2 ** (self.failures - 1) if self.failures else 0)
        if self.failures >= self.max_failures:
            return f"{self.failures} relaunches in a row failed"
        if len(self.times) >= self.max_relaunches:
            return (
                f"{len(self.times)} relaunches within {self.window_s:.0f} s: "
                "the balancer keeps dying"
            )
        return None


def gone(paths: StatePaths, me: int) -> str | None:
    """Why the keeper (pid ``me``) of the cluster in ``paths`` should exit, else ``None``:
    its PID file is gone or names another process (``down`` ran, a fresh ``up`` replaced
    it), ``endpoints.json`` is gone, or none of the cluster's other processes runs."""
    own = supervisor.read_record(paths, KEEPER)
    if own is None or own.pid != me:
        return f"{paths.pid_file(KEEPER)} no longer names it: the cluster was taken down"
    if not paths.endpoints.exists():
        return f"{paths.endpoints} is gone: the cluster was taken down"
    if not any(supervisor.alive(r) for r in supervisor.records(paths) if r.name != KEEPER):
        return "none of the cluster's processes runs any more"
    return None


@dataclass
class Keeper:
    """The keeper of the cluster in ``paths``: one :meth:`look` at a time."""

    paths: StatePaths
    say: Callable[[str], None]
    me: int = field(default_factory=os.getpid)
    backoff: Backoff = field(default_factory=Backoff)
    scrape_timeout_s: float = SCRAPE_TIMEOUT_S
    suspect: frozenset[tuple[str, int, float]] = frozenset()
    """The dead balancer processes of the previous look."""

    def look(self) -> str | None:
        """Look once; relaunch the balancer when this look confirms the previous one saw
        it dead. Returns why the keeper should exit, else ``None``."""
        why = gone(self.paths, self.me)
        if why is not None:
            return why
        try:
            ep = read_endpoints(self.paths)
        except LbtuneError as exc:
            return str(exc)
        if ep is None:
            return f"{self.paths.endpoints} is gone: the cluster was taken down"
        dead = heal.dead_balancer(ep, supervisor.records(self.paths))
        seen = frozenset((r.name, r.pid, r.create_time) for r in dead)
        confirmed = bool(seen) and seen == self.suspect
        self.suspect = seen
        if not confirmed or not self.backoff.ready(time.monotonic()):
            return None
        try:
            healed = heal.heal_if_dead(self.paths, self.say, self.scrape_timeout_s, wait_s=0.0)
        except LbtuneError as exc:
            self.say(f"relaunching {ep.balancer} failed: {exc}")
            return self._count(ok=False)
        return self._count(ok=True) if healed else None

    def _count(self, ok: bool) -> str | None:
        """Count one relaunch with the backoff; why the keeper gives up, else ``None``."""
        self.suspect = frozenset()
        now = time.monotonic()
        give_up = self.backoff.record(now, ok)
        if give_up is not None:
            return (
                f"{give_up}; the balancer is left as it is: `lbtune cluster down "
                f"--state-dir {self.paths.root}` and up again bring the cluster back"
            )
        if not ok:
            self.say(f"trying again in {self.backoff.not_before - now:.0f} s if it is still down")
        return None


def keep(paths: StatePaths, say: Callable[[str], None], poll_s: float = POLL_S) -> str:
    """Keep the cluster in ``paths`` until it is gone (or the keeper gives up); why it ends."""
    me = os.getpid()
    deadline = time.monotonic() + START_TIMEOUT_S
    while (own := supervisor.read_record(paths, KEEPER)) is None or own.pid != me:
        if time.monotonic() >= deadline:
            return f"{paths.pid_file(KEEPER)} never named it"
        time.sleep(0.05)
    keeper = Keeper(paths, say, me)
    say(f"keeping the balancer of {paths.root}: a look every {poll_s:g} s")
    while (why := keeper.look()) is None:
        time.sleep(poll_s)
    return why


def command(paths: StatePaths) -> list[str]:
    return [sys.executable, "-m", "lbtune.cluster.keeper", "--state-dir", str(paths.root)]


def start(paths: StatePaths, cpus: Collection[int] | None = None) -> ProcessRecord:
    """Start the keeper of the cluster in ``paths``, on ``cpus`` when given (the cluster's
    CPUs outside its pinned servers'); its PID file is written on return."""
    return supervisor.start(KEEPER, command(paths), paths, {"PYTHONUNBUFFERED": "1"}, cpus)


def ensure_running(
    paths: StatePaths, say: Callable[[str], None], cpus: Collection[int] | None = None
) -> None:
    """Start the keeper again (on ``cpus`` when given) when it is not running (it gave up,
    or was killed)."""
    own = supervisor.read_record(paths, KEEPER)
    if own is None or not supervisor.alive(own):
        rec = start(paths, cpus)
        say(f"the keeper was not running: started it again (pid {rec.pid}, {rec.log})")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # unwinds a relaunch in progress: it stops what it started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lbtune.cluster.keeper",
        description="Relaunch a dead balancer of the embedded cluster.",
    )
    ap.add_argument("--state-dir", type=Path, required=True, help="the cluster's state dir")
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        why = keep(StatePaths(ns.state_dir.absolute()), log.info)
    except SystemExit:
        log.info("SIGTERM: the keeper exits")
        raise
    log.info("the keeper exits: %s", why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
