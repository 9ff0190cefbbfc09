"""Who holds a cluster now: a study's lease, and the one load test at a time.

A study (``lbtune optimize``) puts experiments live: while it holds the cluster's lease
(``<state>/lease/<target>.json``, written by :func:`lbtune.apply.lease.hold`) nothing
else may change the balancer or load the cluster: ``lbtune apply``, ``lbtune rollback``
and ``lbtune stress`` refuse with one line (:class:`ClusterBusy`, exit 3), and a second
study refuses to take the lease. The holder itself (its trials, its rollout) goes on.
A lease whose holder died is free: its guard is restoring the last known good.

The load generator's client-side exporter listens on the cluster's ``exporter_port``, so
two load tests on one cluster cannot run at once: :func:`load_claim` holds
``<state>/load.lock`` (an exclusive ``flock``, dropped by the kernel when its holder dies)
for the length of one run, and a second one is refused with one line instead of dying with
``Address already in use``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune.errors import LbtuneError
from lbtune.process.locks import pid_lock
from lbtune.records.endpoints import Endpoints

__all__ = [
    "ClusterBusy",
    "holder",
    "lease_path",
    "load_claim",
    "refuse_if_busy",
    "refuse_if_leased",
    "start_time",
    "why_gone",
]


class ClusterBusy(LbtuneError):
    """A study holds the cluster's lease, or another load test runs on it: try again once
    it is done (exit 3, like any infrastructure that is not available)."""

    exit_code = 3


def lease_path(state_dir: str | Path, target: str) -> Path:
    return Path(state_dir) / "lease" / f"{target}.json"


def start_time(pid: int) -> str | None:
    """The process's start time (``/proc/<pid>/stat`` field 22), ``None`` when it is gone
    or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def why_gone(doc: dict[str, object]) -> str | None:
    """Why the holder of lease ``doc`` no longer holds it, or ``None``."""
    pid = int(str(doc["holder"]))
    if start_time(pid) is None or start_time(pid) != doc.get("holder_start"):
        return f"its holder (pid {pid}) died"
    age = time.time() - float(str(doc["renewed_at"]))
    if age > float(str(doc["ttl_s"])):
        return f"its holder (pid {pid}) stopped renewing it {age:.0f} s ago"
    return None


def holder(state_dir: str | Path, target: str) -> int | None:
    """The pid of the live process that holds the lease on ``target`` in ``state_dir``;
    ``None`` when nobody does (no lease, or its holder is gone)."""
    try:
        doc = json.loads(lease_path(state_dir, target).read_text(encoding="utf-8"))
        return None if why_gone(doc) is not None else int(doc["holder"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refuse_if_leased(state_dir: str | Path, target: str, what: str) -> None:
    """:class:`ClusterBusy` when a study of another process holds the lease."""
    pid = holder(state_dir, target)
    if pid is not None and pid != os.getpid():
        raise ClusterBusy(
            f"{what} refused: a study (lbtune optimize, pid {pid}) holds the {target} of the "
            f"cluster in {state_dir} (lease {lease_path(state_dir, target)}); wait until it "
            "ends, or stop it (Ctrl-C restores the last known good)"
        )


def refuse_if_busy(endpoints: Endpoints | None, what: str) -> None:
    """Before a load test on the embedded cluster ``endpoints`` (``None``: an external
    target, nothing to check): :class:`ClusterBusy` while a study of another process holds
    its lease or another load test runs on it. Touches nothing."""
    if endpoints is None:
        return
    refuse_if_leased(endpoints.state_dir, endpoints.balancer, what)
    with load_claim(endpoints):
        pass


@contextmanager
def load_claim(endpoints: Endpoints | None) -> Iterator[None]:
    """Hold the cluster's ``load.lock`` for one load test (nothing for an external
    target); ClusterBusy at once when another process holds it."""
    if endpoints is None:
        yield
        return
    state_dir = endpoints.state_dir

    def refused(other: str) -> LbtuneError:
        return ClusterBusy(
            f"another load test (pid {other}) is running on the cluster in {state_dir}: "
            "one at a time per cluster (they share its exporter port and its replicas); "
            "try again once it is done"
        )

    with pid_lock(Path(state_dir) / "load.lock", refused):
        yield
