"""Independent virtual trials in worker processes, and caches carried from run to run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from lbtune.errors import ConfigError
from lbtune.targets.haproxy.twin import routing_model
from lbtune.twin.options import TwinOptions
from lbtune.twin.pool import NICENESS, TwinJob, TwinPool, load_factory
from lbtune.twin.run import Reuse, simulate
from tests.twin.helpers import cluster_replicas, plan, scenario_file

FACTORY = "lbtune.targets.haproxy.twin:routing_model"


def test_a_pool_gives_the_runs_one_process_gives(tmp_path: Path) -> None:
    p = plan(scenario_file(tmp_path, duration_s=8, warmup_s=1, cooldown_s=1))
    reps = tuple(cluster_replicas("mini2"))
    opts = TwinOptions(time_scale=2)
    jobs = [TwinJob(p, reps, FACTORY, {"algorithm": a}, opts) for a in ("roundrobin", "random")]
    with TwinPool(2) as pool:
        parallel = pool.map(jobs)
    with TwinPool(1) as pool:
        serial = pool.map(jobs)
    assert [r.records for r in parallel] == [r.records for r in serial]
    direct = simulate(p, reps, routing_model({"algorithm": "random"}, reps), opts)
    assert parallel[1].records == direct.records
    assert parallel[0].engines == {}  # the engines stay in the worker


def _spawned_children(besides: set[int]) -> list[psutil.Process]:
    """This process's live ``multiprocessing`` spawn children, other than ``besides``
    (earlier tests on this worker may have left zombies or other children)."""
    out = []
    for c in psutil.Process().children():
        try:
            if c.pid not in besides and any("spawn_main" in a for a in c.cmdline()):
                out.append(c)
        except psutil.Error:
            continue
    return out


def test_pool_workers_yield_the_cpu_to_live_load(tmp_path: Path) -> None:
    """Virtual time does not depend on when a worker runs; a live generator's stamps do."""
    p = plan(scenario_file(tmp_path, duration_s=4, warmup_s=1, cooldown_s=1))
    reps = tuple(cluster_replicas("mini2"))
    jobs = [TwinJob(p, reps, FACTORY, {"algorithm": "roundrobin"}, TwinOptions(time_scale=4))] * 2
    want = os.nice(0) + NICENESS
    before = {c.pid for c in psutil.Process().children()}
    with TwinPool(2) as pool:
        pool.map(jobs)
        workers = _spawned_children(before)
        # The executor starts a worker per job as they come; one may have done both jobs
        # while the other is still importing (its initializer, which lowers it, not run
        # yet). Every worker must get there, within a bounded wait.
        deadline = time.monotonic() + 30
        niceness = [c.nice() for c in workers]
        while niceness != [want] * len(workers) and time.monotonic() < deadline:
            time.sleep(0.05)
            niceness = [c.nice() for c in workers]
    assert 1 <= len(workers) <= 2
    assert niceness == [want] * len(workers)


def test_an_unknown_factory_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no routing model at 'lbtune\.nope:routing_model'"):
        load_factory("lbtune.nope:routing_model")


def test_engines_carried_from_a_run_keep_its_prefix_cache(tmp_path: Path) -> None:
    # The same requests twice on one replica: the second run's prompts hit the cache the
    # first one left (~90k tokens: they all fit), so its first tokens come sooner.
    sc = scenario_file(
        tmp_path,
        duration_s=4,
        warmup_s=1,
        cooldown_s=1,
        prompt_tokens={"type": "fixed", "value": 3000},
    )
    p = plan(sc)
    reps = cluster_replicas("mini2")[:1]
    opts = TwinOptions(time_scale=1)
    cold = simulate(p, reps, routing_model({}, reps), opts)
    warm = simulate(p, reps, routing_model({}, reps), opts, Reuse(engines=cold.engines))
    first_cold = min(r.ttft for r in cold.records if r.ttft is not None)
    first_warm = min(r.ttft for r in warm.records if r.ttft is not None)
    assert first_warm < first_cold / 3
    with pytest.raises(ConfigError, match="cannot carry engine 'x'"):
        simulate(
            p, reps, routing_model({}, reps), opts, Reuse(engines={"x": cold.engines["h100-0"]})
        )
