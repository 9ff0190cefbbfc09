"""A child that never outlives the lbtune that started it, ``kill -9`` included.

:func:`die_with_parent` is a ``preexec_fn`` for :class:`subprocess.Popen`: between fork and
exec the child asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) for SIGKILL once its
parent dies, then checks that the parent did not die before that request (the race a
death signal alone leaves open). On other systems it does nothing; the child's own
watchdog (:mod:`lbtune.loadgen.worker`) remains.

Only for what a command starts for itself (the load generator and its workers, the
twin's process pool, the short checks and builds a target runs): the
embedded cluster's processes are meant to outlive ``lbtune cluster up``, and the lease
guard is meant to outlive the study it guards.

The death signal is tied to the *thread* that started the child: start such children from
a thread that lives as long as they do (lbtune's runner waits for them where it started
them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["arm", "die_with_parent", "hold"]

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


_PRCTL = _prctl()  # resolved here, in the parent: the child between fork and exec only calls it


def arm(parent: int, sig: int = signal.SIGKILL) -> bool:
    """In the child: ``sig`` when the parent dies; ``False`` when ``parent`` is already gone
    (this process was re-parented before the request took effect)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return os.getppid() == parent


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when this process dies, and kills itself at
    once if this process is gone by the time it asks."""
    parent = os.getpid()

    def preexec() -> None:
        if not arm(parent, sig):
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def hold(parent: int) -> None:
    """A process pool's ``initializer`` (module level, so a ``spawn`` context can pickle it):
    the worker gets SIGKILL when ``parent`` dies, and exits at once if it is already gone."""
    if not arm(parent):
        os._exit(1)
