"""Independent virtual trials on several cores: :class:`TwinPool`.

A virtual trial is CPU-bound Python; trials of a screening stage are independent, so they
run in worker processes (one per core by default). Each job names its routing model by
import path (``"lbtune.targets.haproxy.twin:routing_model"``) or by a small picklable
factory (:class:`lbtune.cluster.twin.BalancerModel`), so that a job pickles small and the
worker builds the model itself; each worker keeps the :class:`~lbtune.twin.
requests.RequestSource` of the plans it has seen, so the requests' text and tokens are
built once per worker, not once per trial::

    with TwinPool() as pool:
        runs = pool.map([TwinJob(plan, replicas, FACTORY, params) for params in candidates])

Results come back in the jobs' order, without the replicas' engines (:attr:`TwinRun.
engines` stays in the worker). A job that fails raises its error in the caller.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from types import TracebackType

from lbtune.errors import ConfigError
from lbtune.safety.lifeline import hold
from lbtune.scenario.runplan import RunPlan
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import TwinReplica
from lbtune.twin.requests import RequestSource
from lbtune.twin.result import TwinRun
from lbtune.twin.routing import RoutingFactory
from lbtune.twin.run import Reuse, simulate

__all__ = ["TwinJob", "TwinPool", "load_factory", "run_job"]


@dataclass(frozen=True)
class TwinJob:
    """One virtual trial."""

    plan: RunPlan
    replicas: tuple[TwinReplica, ...]
    factory: str | RoutingFactory
    """``module:function`` of a :class:`~lbtune.twin.routing.RoutingFactory`, or one that
    pickles small."""
    params: Mapping[str, int | float | str | bool]
    options: TwinOptions = field(default_factory=TwinOptions)
    seed: int = 0
    """The routing model's seed."""


def load_factory(path: str) -> RoutingFactory:
    """The routing factory at ``module:function``; ConfigError when there is none."""
    module, _, name = path.partition(":")
    try:
        found: RoutingFactory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ConfigError(f"twin: no routing model at {path!r}") from None
    return found


_SOURCES: dict[str, RequestSource] = {}
"""A worker's request sources, by plan (JSON) and host seed."""


def run_job(job: TwinJob) -> TwinRun:
    """Run one job in this process (what a worker does)."""
    key = f"{job.options.host_seed}:{job.plan.model_dump_json()}"
    src = _SOURCES.get(key)
    if src is None:
        if len(_SOURCES) > 8:
            _SOURCES.clear()
        src = _SOURCES[key] = RequestSource(job.plan, job.options.host_seed)
    factory = load_factory(job.factory) if isinstance(job.factory, str) else job.factory
    model = factory(job.params, job.replicas, seed=job.seed)
    run = simulate(src.plan, job.replicas, model, job.options, Reuse(src))
    return replace(run, engines={})


NICENESS = 10
"""How much lower a pool worker's CPU priority is than its parent's. Virtual time does not
depend on when a worker gets the CPU, and a live load generator's time stamps do: on a
machine where a live run shares the cores (another study, a stress, the test suite's other
workers), the generator gets them first."""


def _worker_start(parent: int) -> None:
    """A pool worker's initializer: it dies with ``parent``, at a lower priority."""
    hold(parent)
    with contextlib.suppress(OSError):
        os.nice(NICENESS)


class TwinPool:
    """Worker processes for virtual trials (``workers`` defaults to the cores this process
    may run on), each at a lower CPU priority (:data:`NICENESS`)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or len(os.sched_getaffinity(0)) or 1)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> TwinPool:
        if self.workers > 1:
            ctx = multiprocessing.get_context("spawn")  # the caller may run threads
            self._pool = ProcessPoolExecutor(  # workers die with this process, kill -9 too
                self.workers,
                mp_context=ctx,
                initializer=_worker_start,
                initargs=(os.getpid(),),
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, jobs: Iterable[TwinJob]) -> list[TwinRun]:
        """Every job's run, in order (in this process when there is one worker)."""
        batch: Sequence[TwinJob] = list(jobs)
        if self._pool is None:
            return [run_job(j) for j in batch]
        return list(self._pool.map(run_job, batch))
