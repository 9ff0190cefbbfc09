"""The target contract, run against every target in the registry (Optuna-style).

Every target must: load its space, apply its baseline, read back exactly what was
applied, touch nothing in check mode, report no change on a repeated apply, and restore
the last known good on rollback. A target whose module or cluster support is not there
yet is skipped with the reason.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from lbtune.apply.lkg import LkgStore
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.targets import TARGETS, get_target
from lbtune.targets.base import ParamSet, Target

pytestmark = pytest.mark.integration

CLUSTER_BALANCER = {"haproxy": "haproxy", "vllm-router": "vllm-router"}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    name: str = request.param
    module = TARGETS[name].partition(":")[0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"target {name}: {module} not importable yet ({exc})")
    if shutil.which("haproxy") is None or shutil.which("prometheus") is None:
        pytest.skip("haproxy and prometheus are needed")
    cfg, _ = load_config("mini2")
    if name != "haproxy":
        try:
            data = cfg.model_dump()
            # Routers without model routing need every replica to serve the same models.
            for group in data["replicas"]:
                group["models"] = ["llama-3.1-8b-instruct"]
            cfg = cfg.model_validate({**data, "balancer": CLUSTER_BALANCER[name]})
        except ValueError as exc:
            pytest.skip(f"the embedded cluster cannot run {name} yet: {str(exc).splitlines()[0]}")
    state = tmp_path_factory.mktemp(name)
    try:
        ep = api.up(cfg, state)
        yield get_target(name, ep)
    finally:
        api.down(state)


def other_params(target: Target) -> ParamSet:
    """A valid non-baseline parameter set: sampled by the space's own Optuna helper."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = target.space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(50):
        params = space.suggest(study.ask())
        if params != space.baseline():
            return params
    raise AssertionError("the space samples only its baseline")


def live_subset(target: Target, keys: Any) -> ParamSet:
    live = target.read_live()
    return {k: live[k] for k in keys}


def test_space_loads_and_its_baseline_validates(target: Target) -> None:
    space = target.space()
    assert space.names
    assert space.validate(space.baseline()) == space.baseline()


def test_baseline_applies_and_reads_back(target: Target) -> None:
    base = target.space().baseline()
    result = target.apply(base)
    assert result.applied == target.read_live()
    assert live_subset(target, base) == base


def test_read_back_matches_an_applied_set_and_a_repeat_is_no_change(target: Target) -> None:
    params = other_params(target)
    first = target.apply(params)
    assert first.changed and first.diff
    assert live_subset(target, params) == params
    again = target.apply(params)
    assert not again.changed and again.diff == {}


def test_check_mode_reports_a_diff_and_touches_nothing(target: Target) -> None:
    before = target.read_live()
    base = target.space().baseline()
    result = target.apply(base, check=True)
    assert result.check and (result.changed == (before != {**before, **base}))
    assert target.read_live() == before


def test_rollback_restores_the_last_known_good(target: Target) -> None:
    base = target.space().baseline()
    target.apply(base)
    LkgStore(target.state_dir, target.name).record(target.read_live(), "test")
    target.apply(other_params(target))
    target.rollback()
    assert live_subset(target, base) == base
