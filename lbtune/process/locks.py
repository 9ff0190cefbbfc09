"""Exclusive locks on a state dir's files: an ``flock`` that the kernel drops when its
holder dies, so a crashed holder never leaves a stale lock behind; the file keeps the
holder's PID for the message that names it. One primitive for every such lock: the
cluster's apply lock and load claim (:mod:`lbtune.apply`), the balancer's heal lock
(:mod:`lbtune.cluster.heal`).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["pid_lock"]

_RETRY_S = 0.1


@contextmanager
def pid_lock(
    path: Path, refused: Callable[[str], BaseException], wait_s: float = 0.0
) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` (created), writing this process's PID in it;
    when another process holds it after ``wait_s`` seconds (0: at once), ``refused(holder
    pid)`` is raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise refused(holder) from None
                time.sleep(_RETRY_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
