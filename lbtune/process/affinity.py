"""Which CPUs a process lbtune starts runs on, when a cluster reserves some for its servers.

The vLLM preset pins its servers to CPUs (``vllm.cpus``, :mod:`lbtune.cluster.vllm`), and
``up`` records them once in the cluster's endpoints (``reserved_cpus``). Everything else
lbtune starts around those servers (the cluster's balancer, Prometheus, agent and keeper;
the load generator's processes) runs on :func:`complement`: the CPUs this process may use,
the reserved ones taken out. Measured on 2 cores, a 16-user chat load through HAProxy to
two vLLM servers on CPU 1: 8.4 req/s with the rest unpinned, 10.8 req/s with it on CPU 0
(docs/vllm.md). Where that would leave no CPU, nothing is pinned.

The pin is ``sched_setaffinity`` between fork and exec (:func:`pin`, a ``preexec_fn``), so
the program starts on those CPUs and every thread and process it makes inherits them (a
pin after the start would miss the threads a Go or C program has already made: it moves
one thread, not a process).

lbtune's own process (the runner's record tail, ``twin fit``'s probes) moves itself off
the reserved CPUs while it loads the cluster (:func:`kept_off`): every thread it has then,
and so every thread it starts meanwhile; afterwards its threads go back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

__all__ = ["complement", "kept_off", "pin", "usable"]


def usable() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def complement(reserved: Collection[int]) -> frozenset[int] | None:
    """The CPUs this process may use outside ``reserved``; ``None`` (leave the affinity as
    it is) when nothing is reserved, when nothing would be left, or where a process's CPUs
    cannot be set (not Linux)."""
    if not reserved or not hasattr(os, "sched_setaffinity"):
        return None
    return usable() - frozenset(reserved) or None


@contextmanager
def kept_off(reserved: Collection[int]) -> Iterator[frozenset[int] | None]:
    """This process, every thread of it, off ``reserved`` (on :func:`complement`) for the
    duration; the CPUs it runs on meanwhile, ``None`` when it was left as it is. Its threads
    are put back on the CPUs it had before at the end."""
    cpus = complement(reserved)
    if cpus is None:
        yield None
        return
    before = usable()
    _move_all(cpus)
    try:
        yield cpus
    finally:
        _move_all(before)


def _move_all(cpus: frozenset[int]) -> None:
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue


def pin(
    cpus: Collection[int] | None, then: Callable[[], None] | None = None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that moves the child to ``cpus`` and then runs ``then`` (another
    ``preexec_fn``); just ``then`` when ``cpus`` is ``None``."""
    if cpus is None:
        return then
    mask = frozenset(cpus)

    def preexec() -> None:
        os.sched_setaffinity(0, mask)
        if then is not None:
            then()

    return preexec
