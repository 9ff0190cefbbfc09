"""A lease on the live balancer: whoever puts experiments live (``lbtune optimize``) holds
it and renews it; a small guard process restores the last known good when the holder dies
(``kill -9`` included) or stops renewing, then exits.

The lease is ``<state>/lease/<target>.json`` (holder pid and its start time, last renewal,
ttl; :mod:`lbtune.apply.claim` reads it: while it is held, ``apply``, ``rollback`` and
``stress`` of other processes refuse, and so does a second study's :func:`hold`).
:func:`hold` writes it, starts the guard in its own session (so a signal to the
holder's process group does not reach it), and renews it from a daemon thread every
``ttl/4``; its release callable removes the file, and the guard then exits touching
nothing. The guard checks every :data:`POLL_S`: the file gone → exit; the holder dead (or
a zombie, or its pid reused) or the lease older than its ttl → ``lbtune.apply.rollback``
(direct, under the apply lock, retried while another apply holds the lock) → exit.
Its log is ``<state>/logs/lease-guard-<target>.log``.

    python -m lbtune.apply.lease --state-dir DIR --target NAME --holder PID [--space FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lbtune.apply import rollback
from lbtune.apply.claim import ClusterBusy, holder, lease_path, start_time, why_gone
from lbtune.errors import ApplyError, LbtuneError
from lbtune.records.statedir import StatePaths, read_endpoints
from lbtune.targets import get_target

__all__ = ["LEASE_TTL_S", "POLL_S", "hold", "main"]

LEASE_TTL_S = 15.0
"""A holder that has not renewed for this long is taken for dead."""
POLL_S = 0.2
RESTORE_WAIT_S = 60.0
"""How long the guard waits for another apply's lock before it gives up."""

log = logging.getLogger(__name__)


def _write(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def hold(
    state_dir: str | Path,
    target: str,
    *,
    space_file: Path | None = None,
    ttl_s: float = LEASE_TTL_S,
) -> Callable[[], None]:
    """Take the lease for this process and start its guard; returns the release (call it
    once the balancer is back on a known good state). :class:`ClusterBusy` when a study of
    another live process holds it: two studies never share a cluster."""
    path = lease_path(state_dir, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    doc: dict[str, object] = {
        "holder": pid,
        "holder_start": start_time(pid),
        "renewed_at": time.time(),
        "ttl_s": ttl_s,
    }
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # check and take at once: two studies may race
        other = holder(state_dir, target)
        if other is not None and other != pid:
            raise ClusterBusy(
                f"a study (lbtune optimize, pid {other}) already holds the {target} of the "
                f"cluster in {state_dir}: two studies never share a cluster; wait until it "
                "ends, or run this one on another cluster (--state-dir)"
            )
        _write(path, doc)
    logs = Path(state_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "lbtune.apply.lease",
        "--state-dir",
        str(state_dir),
        "--target",
        target,
        "--holder",
        str(pid),
    ]
    if space_file is not None:
        argv += ["--space", str(space_file)]
    with (logs / f"lease-guard-{target}.log").open("ab") as out:
        guard = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    done = threading.Event()

    def renew() -> None:
        while not done.wait(ttl_s / 4):
            try:
                _write(path, {**doc, "renewed_at": time.time()})
            except OSError:  # the state dir went away: nothing left to guard
                return

    threading.Thread(target=renew, name="lbtune-lease", daemon=True).start()

    def release() -> None:
        if done.is_set():
            return
        done.set()
        path.unlink(missing_ok=True)
        try:
            guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("the lease guard (pid %d) did not exit after the release", guard.pid)

    return release


def _restore(state_dir: Path, target: str, space_file: Path | None, why: str) -> None:
    ep = read_endpoints(StatePaths(state_dir))
    if ep is None:
        log.info("lease expired (%s) but no cluster runs in %s: nothing to restore", why, state_dir)
        return
    t = get_target(target, ep, space_file=space_file)
    log.info("lease expired (%s): restoring the last known good", why)
    deadline = time.monotonic() + RESTORE_WAIT_S
    while True:
        try:
            outcome = rollback(t, via="direct")
        except ApplyError as exc:
            if "Another apply is running" in str(exc) and time.monotonic() < deadline:
                time.sleep(POLL_S)
                continue
            raise
        lkg = outcome.lkg.describe() if outcome.lkg else "?"
        log.warning("lease expired (%s): restored the last known good %s", why, lkg)
        return


def watch(state_dir: Path, target: str, holder: int, space_file: Path | None = None) -> int:
    """The guard's loop for ``holder``'s lease; 0 when released (or taken over by a new
    holder, whose own guard watches it) or restored, 1 when the restore failed."""
    path = lease_path(state_dir, target)
    while True:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0  # released
        except ValueError:
            time.sleep(POLL_S)  # being replaced
            continue
        if doc.get("holder") != holder:
            return 0
        why = why_gone(doc)
        if why is not None:
            try:
                _restore(state_dir, target, space_file, why)
            except LbtuneError as exc:
                log.error("lease expired (%s); restoring the last known good failed: %s", why, exc)
                return 1
            finally:
                path.unlink(missing_ok=True)
            return 0
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lbtune.apply.lease", description=__doc__)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--holder", type=int, required=True)
    ap.add_argument("--space", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s lease-guard %(message)s")
    return watch(args.state_dir, args.target, args.holder, args.space)


if __name__ == "__main__":
    sys.exit(main())
