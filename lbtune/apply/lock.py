"""One apply at a time per state dir: an exclusive ``flock`` on ``<state>/apply.lock``.

The kernel drops the lock when the holder dies, so a crashed apply never leaves a stale
lock behind; the file keeps the holder's PID for the error message.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lbtune.errors import ApplyError

__all__ = ["apply_lock"]


@contextmanager
def apply_lock(state_dir: str | Path) -> Iterator[Path]:
    """Hold ``<state_dir>/apply.lock``; ApplyError at once when another apply holds it."""
    path = Path(state_dir) / "apply.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ApplyError(
                f"Another apply is running on {state_dir} (pid {holder}); wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
