"""A load run against the embedded cluster whose servers are pinned puts its generator
on the other CPUs (:attr:`lbtune.run.target.ResolvedTarget.generator_cpus`), down to
the generator's settings, and counts only those when it spreads the load; where no CPU
would be left, it runs where lbtune runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lbtune.cluster import api
from lbtune.cluster.health import ClusterStatus
from lbtune.loadgen.runner import _settings
from lbtune.records.endpoints import Endpoints
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions, _load_config, _workers
from lbtune.run.target import ResolvedTarget, resolve_target
from tests.records.test_endpoints import old_record


def _cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usable: set[int], reserved: list[int]
) -> ResolvedTarget:
    """The target resolved for a running embedded cluster reserving ``reserved``, as
    seen by a process that may use ``usable``."""
    ep = Endpoints.model_validate({**old_record(tmp_path), "reserved_cpus": reserved})
    up = ClusterStatus(
        state_dir=str(tmp_path),
        running=True,
        healthy=True,
        endpoints=ep,
        components=[],
        replicas=[],
        problems=[],
    )
    monkeypatch.setattr(api, "status", lambda state_dir=None: up)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(usable))
    return resolve_target(StressOptions(state_dir=tmp_path), lambda m: None)


def _generator(tmp_path: Path, target: ResolvedTarget) -> tuple[frozenset[int] | None, object]:
    opts = StressOptions(scenario="chat", duration_s=5, users=4)
    plan = plan_run(opts)
    cfg = _load_config(opts, plan, target, tmp_path / "run.json", 0)
    return cfg.cpus, _settings(cfg, tmp_path).cpus


def test_the_generator_runs_off_the_servers_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _cluster(tmp_path, monkeypatch, {0, 1, 2}, [1])
    assert target.generator_cpus == frozenset({0, 2})
    assert _generator(tmp_path, target) == (frozenset({0, 2}), (0, 2))


@pytest.mark.parametrize(("usable", "reserved"), [({0, 1}, [0, 1]), ({0}, [0]), ({0, 1}, [])])
def test_with_no_cpu_left_or_none_reserved_it_runs_where_lbtune_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usable: set[int], reserved: list[int]
) -> None:
    target = _cluster(tmp_path, monkeypatch, usable, reserved)
    assert target.generator_cpus is None
    assert _generator(tmp_path, target) == (None, None)


def test_a_url_target_is_not_pinned(tmp_path: Path) -> None:
    target = ResolvedTarget("http://127.0.0.1:9", None, None, None, False)
    assert _generator(tmp_path, target) == (None, None)


def test_the_spread_counts_only_the_generators_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_run(StressOptions(scenario="chat", duration_s=5, users=3 * 256))
    said: list[str] = []
    pinned = _cluster(tmp_path, monkeypatch, {0, 1, 2, 3}, [1, 2])
    assert _workers(StressOptions(), plan, pinned, said.append) == 2
    assert said[0] == "generator: on CPUs [0, 3], off the servers' [1, 2]"
    free = _cluster(tmp_path, monkeypatch, {0, 1, 2, 3}, [])
    assert _workers(StressOptions(), plan, free, said.append) == 3
