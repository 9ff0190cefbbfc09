"""One apply at a time per state dir: an exclusive ``flock`` on ``<state>/apply.lock``.

The kernel drops the lock when the holder dies, so a crashed apply never leaves a stale
lock behind; the file keeps the holder's PID for the error message. :func:`pid_lock` is
the one such lock (``lbtune.apply.claim`` holds the cluster's ``load.lock`` with it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune.errors import ApplyError, LbtuneError

__all__ = ["apply_lock", "pid_lock"]


@contextmanager
def pid_lock(path: Path, refused: Callable[[str], LbtuneError]) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` (created), writing this process's PID in
    it; ``refused(holder_pid)`` is raised at once when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise refused(holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def apply_lock(state_dir: str | Path) -> Iterator[Path]:
    """Hold ``<state_dir>/apply.lock``; ApplyError at once when another apply holds it."""

    def refused(holder: str) -> LbtuneError:
        return ApplyError(
            f"Another apply is running on {state_dir} (pid {holder}); wait for it to finish"
        )

    with pid_lock(Path(state_dir) / "apply.lock", refused) as path:
        yield path
