"""One apply at a time per state dir: an exclusive lock on ``<state>/apply.lock``
(:func:`lbtune.process.locks.pid_lock`; a relaunch of a dead balancer takes it too before
it puts the last known good back, :mod:`lbtune.cluster.heal`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune.errors import ApplyError, LbtuneError
from lbtune.process.locks import pid_lock
from lbtune.records.statedir import StatePaths

__all__ = ["apply_lock"]


@contextmanager
def apply_lock(state_dir: str | Path) -> Iterator[Path]:
    """Hold ``<state_dir>/apply.lock``; ApplyError at once when another apply holds it."""

    def refused(holder: str) -> LbtuneError:
        return ApplyError(
            f"Another apply is running on {state_dir} (pid {holder}); wait for it to finish"
        )

    with pid_lock(StatePaths(Path(state_dir)).apply_lock, refused) as path:
        yield path
